"""The gateway's refusals end to end, in OpenAI's error shape: bad parameters, tools and schemas,
malformed and oversized bodies; hostile bodies parsed in worker processes (which die with it)."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.gateway_process import MESSAGES, base_url, request_json, start_gateway
from tests.e2e.processes import Pair, Service

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"temperature": -1.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"stop": ["ok", ""]}, "stop[1]"),
    ],
)
def test_a_bad_parameter_is_400_in_openai_shape(
    sdk: openai.OpenAI, model: str, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.completions.create(model=model, prompt="Hi", **kwargs)
    error = raised.value.body
    assert raised.value.status_code == 400
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]


def test_chat_refuses_unknown_tools_and_bad_schemas_by_name(sdk: openai.OpenAI, model: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    named = {"type": "function", "function": {"name": "g"}}
    for kwargs, param in (
        ({"tools": [tool], "tool_choice": named}, "tool_choice"),
        ({"response_format": bad_schema}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            sdk.chat.completions.create(model=model, **{"messages": MESSAGES, **kwargs})
        assert raised.value.body["param"] == param


def test_plain_http_errors_keep_openai_shape(gateway: Service, model: str) -> None:
    url = base_url(gateway)
    status, body = request_json("POST", url + "/v1/completions", b"{not json")
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body = request_json("POST", url + "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and body["error"]["param"] == "model"
    # a body past --max-body-bytes (default 8 MiB) is refused by its Content-Length, unread
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(9 * 1024 * 1024))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"]["code"] == "request_too_large"
    connection.close()
    status, body = request_json("GET", url + "/v1/nothing")
    assert status == 404 and "error" in body


def test_large_hostile_bodies_do_not_stall_the_gateway(gateway: Service, model: str) -> None:
    """Bodies within --max-body-bytes whose JSON is slow to build (600k object keys: ~0.3 s of
    parsing, 400k nested lists, 65k messages) are parsed in a worker process and refused by size
    before their items are built: a /health prober beside them stays fast (it waited 0.3 s on
    the first before), and each gets its 400 naming the field."""
    url = base_url(gateway)
    worst, stop = [0.0], threading.Event()

    def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            with urllib.request.urlopen(url + "/health", timeout=30) as response:
                response.read()
            worst[0] = max(worst[0], time.perf_counter() - start)
            time.sleep(0.01)

    fields = {
        "logit_bias": {"logit_bias": {str(i): 1 for i in range(600_000)}},
        "allowed_token_ids": {"allowed_token_ids": [1] * 1_000_000},
        "prompt": {"prompt": [[1, 2], [3]] * 200_000},
    }
    # encoded before the prober starts: json.dumps holds this process's GIL (the prober's) too
    bodies = {
        k: json.dumps({"model": "m", "prompt": "hi", **v}).encode() for k, v in fields.items()
    }
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        while worst[0] == 0.0:  # the first probe opens the connections: not counted
            time.sleep(0.01)
        time.sleep(0.5)
        worst[0] = 0.0
        for param, body in bodies.items():
            path = "/v1/chat/completions" if param == "messages" else "/v1/completions"
            status, reply = request_json("POST", url + path, body)
            assert status == 400 and reply["error"]["param"] == param, reply
    finally:
        stop.set()
        prober.join()
    print(f"\nworst /health beside the hostile bodies: {worst[0] * 1000:.0f} ms")
    assert worst[0] < 0.25


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux's /proc/PID/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_body_parse_workers_die_with_a_killed_gateway(services: Pair) -> None:
    gateway = start_gateway(services.frontend.address)
    deadline = time.monotonic() + 20
    while len(workers := children_of(gateway.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # started by the app's start-up, after the socket listens
    assert len(workers) >= 2, "the gateway starts its two body-parse workers at start-up"
    gateway.kill()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if Path(f"/proc/{p}").exists()]
