"""The gateway in front of a guarded frontend, end to end: API keys checked, a full frontend
answered 429, mutual TLS to the frontend with the caller's key passed on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve import Client
from tests.e2e.gateway_process import base_url, request_json, start_gateway
from tests.e2e.processes import Pair, Service, start_frontend, start_pair

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e
KEY = "gateway-test-key"


@pytest.fixture(scope="module")
def guarded(tiny_model_dir: Path) -> Iterator[tuple[Pair, Service]]:
    """A frontend with an API key and room for one request at a time, and its gateway."""
    pair = start_pair(
        tiny_model_dir, frontend_args=("--api-keys", KEY, "--max-concurrent-requests", "1")
    )
    gateway = start_gateway(pair.frontend.address)
    yield pair, gateway
    gateway.stop()
    pair.stop()


def test_admission_full_is_429_and_tokens_are_checked(guarded: tuple[Pair, Service]) -> None:
    pair, gateway = guarded
    url = base_url(gateway) + "/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
    status, body = request_json("GET", url + "/models")
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert request_json("GET", base_url(gateway) + "/health")[0] == 200  # health stays open
    sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    (model,) = [m.id for m in sdk.models.list().data]
    assert request_json("GET", url + "/models")[0] == 401  # still checked once the name is known
    status, body = request_json("POST", url + "/completions", {"model": model, "prompt": "x"})
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    with Client(pair.frontend.address, token=KEY) as client:
        busy = client.generate_stream("Hi", max_tokens=3000, ignore_eos=True)
        next(busy)  # the one admitted request runs
        try:
            with pytest.raises(openai.RateLimitError) as raised:
                sdk.completions.create(model=model, prompt="Hi", max_tokens=4)
            assert raised.value.status_code == 429
            assert raised.value.body["type"] == "rate_limit_error"
        finally:
            busy.close()
    deadline = time.monotonic() + 10
    while True:  # the slot frees once the cancelled call has ended on the frontend
        try:
            done = sdk.completions.create(model=model, prompt="Hi", max_tokens=4)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert done.usage.completion_tokens <= 4


def test_gateway_reaches_a_mutual_tls_frontend_with_the_callers_key(
    services: Pair, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One keys file for gRPC and HTTP; the gateway dials TLS with a client certificate."""
    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs")
    keys = tmp_path / "api_keys"
    keys.write_text(f"tenant-a {KEY}\n")
    frontend = start_frontend(
        tiny_model_dir,
        services.worker.address,
        *("--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key)),
        *("--tls-client-ca-file", str(certs.ca), "--api-keys-file", str(keys)),
        wait=False,
    )
    tls = {"root_certificates": certs.ca, "client_cert": certs.client_cert}
    try:
        with Client(frontend.wait_listening(), client_key=certs.client_key, **tls) as client:
            client.wait_ready(timeout=90)
        gateway = start_gateway(
            f"localhost:{frontend.port}",  # the name the server certificate holds
            *("--tls-root-certificates-file", str(certs.ca)),
            *("--tls-client-cert-file", str(certs.client_cert)),
            *("--tls-client-key-file", str(certs.client_key)),
        )
        try:
            url = base_url(gateway) + "/v1"
            sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
            (model,) = [m.id for m in sdk.models.list().data]
            reply = sdk.completions.create(model=model, prompt="Hi", max_tokens=3)
            assert reply.usage.completion_tokens == 3
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).completions.create(
                    model=model, prompt="Hi", max_tokens=3
                )
            assert request_json("GET", base_url(gateway) + "/health")[0] == 200
        finally:
            assert gateway.stop() == 0, gateway.output()
    finally:
        frontend.stop()


def _raw_authorization(gateway: Service, value: bytes) -> tuple[int, dict]:
    """GET /v1/models with these exact bytes as the Authorization header."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    try:
        conn.putrequest("GET", "/v1/models")
        conn.putheader("Authorization", value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_key_is_checked_before_the_body_and_the_model(guarded: tuple[Pair, Service]) -> None:
    """Issue 32: no body parse, no 400, no 404-vs-401 model oracle and no 500 for a caller without
    a valid key; /openapi.json is not served to anyone."""
    _, gateway = guarded
    url = base_url(gateway) + "/v1"
    sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    (model,) = [m.id for m in sdk.models.list().data]  # the gateway knows the name now
    bad_body = request_json("POST", url + "/chat/completions", {"model": model, "messages": 5})
    assert bad_body[0] == 401, bad_body
    for name in ("guess", model):  # the same answer whichever name is tried
        status, body = request_json("POST", url + "/completions", {"model": name, "prompt": "x"})
        assert status == 401 and body["error"]["type"] == "authentication_error", body
    wrong = request_json("POST", base_url(gateway) + "/tokenize", {"prompt": "x"}, token="wrong")
    assert wrong[0] == 401
    for value in (b"Bearer t\xf6k", b"Bearer a\x01b", b"Bearer " + b"k" * 5000):
        status, body = _raw_authorization(gateway, value)
        assert status == 401 and body["error"]["type"] == "authentication_error", (value, body)
    assert "Traceback" not in gateway.output(400)
    assert (
        request_json("POST", base_url(gateway) + "/tokenize", {"prompt": "x"}, token=KEY)[0] == 200
    )
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(base_url(gateway) + "/openapi.json", timeout=30)
    assert raised.value.code == 404


def test_gateway_serves_https_and_requires_client_certificates(
    services: Pair, tmp_path: Path
) -> None:
    """--tls-cert-file/--tls-key-file make the gateway HTTPS; --tls-client-ca-file makes it mutual:
    a caller without a certificate the CA signed gets no HTTP exchange at all."""
    import json
    import ssl
    import urllib.request

    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs")
    gateway = start_gateway(
        services.frontend.address,
        *("--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key)),
        *("--tls-client-ca-file", str(certs.ca)),
    )
    url = f"https://localhost:{gateway.port}"
    try:
        anonymous = ssl.create_default_context(cafile=str(certs.ca))
        with pytest.raises(OSError):  # the handshake (or its first read) fails: no certificate
            urllib.request.urlopen(url + "/health", context=anonymous, timeout=30).read()
        with pytest.raises(OSError):  # plain HTTP to a TLS port is no request either
            urllib.request.urlopen(base_url(gateway) + "/health", timeout=30).read()
        tenant = ssl.create_default_context(cafile=str(certs.ca))
        tenant.load_cert_chain(str(certs.client_cert), str(certs.client_key))
        with urllib.request.urlopen(url + "/v1/models", context=tenant, timeout=30) as reply:
            (model,) = [m["id"] for m in json.loads(reply.read())["data"]]
        body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 3}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, context=tenant, timeout=60) as reply:
            assert json.loads(reply.read())["usage"]["completion_tokens"] == 3
    finally:
        assert gateway.stop() == 0, gateway.output()
