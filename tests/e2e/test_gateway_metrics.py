"""Operating the gateway end to end: metrics on --metrics-port, the request log, X-Request-Id, and
a client that leaves a stream (its gRPC call cancelled, logged as 499)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair, Service, assert_idle

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def metered(services: Pair) -> Iterator[tuple[Service, int]]:
    """A gateway with --metrics-port, and that port."""
    port = free_port()
    gateway = start_gateway(services.frontend.address, "--metrics-port", str(port))
    yield gateway, port
    assert gateway.stop() == 0, gateway.output()


def http_call(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """(status, response headers, body) of one POST, errors included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    for name, value in {"Content-Type": "application/json", **headers}.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def request_lines(gateway: Service, request_id: str, timeout: float = 10.0) -> list[str]:
    """The gateway's log lines for `request_id`, once there is one: a request is logged as its
    response ends, a moment after the client read its last byte."""
    deadline = time.monotonic() + timeout
    while True:
        found = [ln for ln in gateway.lines if f"nanoserve.requests: request '{request_id}' " in ln]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_metrics_request_log_and_request_ids(
    metered: tuple[Service, int], model: str, services: Pair
) -> None:
    """A completion, a streamed chat and a 400 move the counters by route and status and leave one
    log line each, under the caller's X-Request-Id (which the frontend's line carries too) or,
    for an id past 128 characters, one the gateway made; no token or prompt text is logged."""
    gateway, port = metered
    url, secret, prompt = base_url(gateway), "sk-never-logged", "A zebra named Quillfeather"
    before = scrape(port)
    auth = {"Authorization": f"Bearer {secret}"}
    status, headers, raw = http_call(
        url + "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": 5, "ignore_eos": True},
        {**auth, "X-Request-Id": "e2e-completion-1"},
    )
    assert status == 200 and headers["x-request-id"] == "e2e-completion-1"
    usage = json.loads(raw)["usage"]
    status, headers, raw = http_call(
        url + "/v1/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6,
            "ignore_eos": True,
            "stream": True,
        },
        {**auth, "X-Request-Id": "e2e-chat-1"},
    )
    assert status == 200 and headers["x-request-id"] == "e2e-chat-1"
    assert raw.endswith(b"data: [DONE]\n\n")
    status, headers, raw = http_call(
        url + "/v1/completions",
        {"model": model, "prompt": prompt, "frobnicate": 1},
        {**auth, "X-Request-Id": "x" * 129},
    )
    made = headers["x-request-id"]
    assert status == 400 and re.fullmatch(r"[0-9a-f]{32}", made), made

    (line,) = request_lines(gateway, "e2e-completion-1")
    assert (
        f"request 'e2e-completion-1' POST /v1/completions 200 finish=length "
        f"prompt={usage['prompt_tokens']} completion=5 ttft=- duration="
    ) in line
    (line,) = request_lines(gateway, "e2e-chat-1")
    assert re.search(
        r"request 'e2e-chat-1' POST /v1/chat/completions 200 finish=length prompt=\d+ "
        r"completion=6 ttft=\d+\.\d{3}s duration=\d+\.\d{3}s peer=127\.0\.0\.1:\d+$",
        line.rstrip(),
    ), line
    (line,) = request_lines(gateway, made)
    assert f"request '{made}' POST /v1/completions 400 finish=- prompt=- completion=-" in line
    assert not [ln for ln in gateway.lines if secret in ln or "Quillfeather" in ln]
    # the id went on as the gRPC request_id: the frontend's own line has it
    assert [ln for ln in services.frontend.lines if "request 'e2e-chat-1' Chat OK" in ln]

    after = scrape(port)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests = "nanoserve:gateway_requests_total"
    assert delta(requests, route="/v1/completions", status="200") == 1
    assert delta(requests, route="/v1/completions", status="400") == 1
    assert delta(requests, route="/v1/chat/completions", status="200") == 1
    duration = "nanoserve:gateway_request_duration_seconds"
    assert delta(f"{duration}_count", route="/v1/completions") == 2
    assert delta(f"{duration}_count", route="/v1/chat/completions") == 1
    assert delta(f"{duration}_bucket", route="/v1/chat/completions", le="+Inf") == 1
    assert delta(f"{duration}_sum", route="/v1/chat/completions") > 0
    first_event = "nanoserve:gateway_time_to_first_event_seconds_count"
    assert delta(first_event, route="/v1/chat/completions") == 1
    assert delta(first_event, route="/v1/completions") == 0  # not streamed
    assert delta("nanoserve:gateway_request_body_bytes_count", route="/v1/completions") == 2
    assert delta("nanoserve:gateway_completion_tokens_total", route="/v1/completions") == 5
    assert delta("nanoserve:gateway_completion_tokens_total", route="/v1/chat/completions") == 6
    assert (
        delta("nanoserve:gateway_prompt_tokens_total", route="/v1/completions")
        == usage["prompt_tokens"]
    )
    assert after[("nanoserve:gateway_requests_in_flight", ())] == 0


def test_a_stream_the_client_left_is_logged_499(
    metered: tuple[Service, int], model: str, services: Pair
) -> None:
    gateway, port = metered
    before = scrape(port)
    data = json.dumps(
        {"model": model, "prompt": "Hi", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    ).encode()
    request = urllib.request.Request(base_url(gateway) + "/v1/completions", data=data)
    request.add_header("Content-Type", "application/json")
    request.add_header("X-Request-Id", "e2e-left")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")
    (line,) = request_lines(gateway, "e2e-left")
    assert "POST /v1/completions 499 finish=- prompt=- completion=- ttft=" in line
    assert_idle(services.worker.address, timeout=10.0)
    key = ("nanoserve:gateway_requests_total", (("route", "/v1/completions"), ("status", "499")))
    assert scrape(port).get(key, 0.0) - before.get(key, 0.0) == 1


def test_client_disconnect_cancels_the_grpc_call(
    gateway: Service, model: str, services: Pair
) -> None:
    request = {
        "model": model,
        "prompt": "Hi",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    data = json.dumps(request).encode()
    http_request = urllib.request.Request(base_url(gateway) + "/v1/completions", data=data)
    http_request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(http_request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")
    assert_idle(services.worker.address, timeout=10.0)
