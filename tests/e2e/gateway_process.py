"""The OpenAI-compatible gateway as a process for the e2e tests: start_gateway (port 0, read from
its listening line), its base URL, one plain JSON request, a chat conversation and a JSON schema to send."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request

from tests.e2e.processes import Service

GATEWAY_LISTENING = re.compile(r"gateway listening on (?P<host>\S+):(?P<port>\d+)")
MESSAGES = [{"role": "user", "content": "Say something about the sea."}]
# a JSON schema for structured-output requests (a tiny model's random weights still fill it)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def start_gateway(frontend_address: str, *args: str) -> Service:
    gateway = Service(
        "gateway",
        [
            sys.executable,
            "-m",
            "nanoserve.frontend.gateway",
            *("--frontend-address", frontend_address, "--port", "0", *args),
        ],
        listening=GATEWAY_LISTENING,
    )
    try:
        gateway.wait_listening()
    except BaseException:
        gateway.kill()
        raise
    return gateway


def request_json(method: str, url: str, body: dict | bytes | None = None, token: str | None = None):
    """(status, parsed JSON body) of one plain HTTP request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def base_url(gateway: Service) -> str:
    return f"http://127.0.0.1:{gateway.port}"
