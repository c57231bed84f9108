"""The gateway's per-request record (frontend/gateway/access.py) and metrics (metrics.py) without any
service: the X-Request-Id rule, the log line, what AccessLog sees of plain, streamed, refused and
abandoned responses, and what GatewayMetrics counts from it."""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import pytest

pytest.importorskip("fastapi", reason="the gateway extra: pip install 'nanoserve[gateway]'")

from nanoserve.client.messages import Usage
from nanoserve.frontend.gateway.access import (
    Access,
    AccessLog,
    RequestLog,
    access_of,
    request_id_from,
)

ROUTES = ("/v1/completions", "/v1/chat/completions", "/health")


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (b"abc-123", "abc-123"),
        (b"x" * 128, "x" * 128),
        (b"trace id/7:a=b", "trace id/7:a=b"),  # printable ASCII, spaces included
        (b"x" * 129, None),  # longer than the frontend's request_id
        (b"", None),
        (None, None),
        (b"caf\xc3\xa9", None),  # not ASCII
        (b"a\tb", None),  # a control character: it would break the log line
        (b"a\x7fb", None),
    ],
)
def test_request_id_rule(header: bytes | None, accepted: str | None) -> None:
    assert request_id_from(header) == accepted


def test_log_line_format() -> None:
    access = Access("req-1", "/v1/chat/completions", "POST", "10.0.0.7:51234", start=100.0)
    access.status, access.first_event_at, access.end = 200, 100.0125, 101.5
    access.ended(Usage(12, 30, 0), "length")
    assert RequestLog().format(access) == (
        "request 'req-1' POST /v1/chat/completions 200 finish=length prompt=12 completion=30"
        " ttft=0.013s duration=1.500s peer=10.0.0.7:51234"
    )
    refused = Access("r2", "/v1/completions", "POST", "-", start=5.0, status=400, end=5.002)
    assert RequestLog().format(refused) == (
        "request 'r2' POST /v1/completions 400 finish=- prompt=- completion=- ttft=- "
        "duration=0.002s peer=-"
    )


def test_json_log_lines() -> None:
    access = Access("req-1", "/v1/chat/completions", "POST", "10.0.0.7:51234", start=100.0)
    access.status, access.first_event_at, access.end = 200, 100.0125, 101.5
    access.ended(Usage(12, 30, 0), "length")
    assert json.loads(RequestLog("json").format(access)) == {
        "event": "request_end",
        "request_id": "req-1",
        "method": "POST",
        "route": "/v1/chat/completions",
        "status": 200,
        "finish_reason": "length",
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "ttft_s": 0.0125,
        "duration_s": 1.5,
        "peer": "10.0.0.7:51234",
    }
    with pytest.raises(ValueError, match="log_format"):
        RequestLog("xml")


def test_outcome_status() -> None:
    access = Access("r", "/v1/completions", "POST", "-", status=200)
    assert access.outcome == 200
    access.ended(None, None, 503)  # a stream whose error event said 503
    assert access.outcome == 503
    access.disconnected = True
    assert access.outcome == 499
    assert Access("r", "/health", "GET", "-").outcome == 500  # nothing was ever sent


App = Callable[[dict, Callable, Callable], Awaitable[None]]


def serve(
    app: App,
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    path: str = "/v1/completions",
    incoming: list[dict] | None = None,
) -> tuple[list[dict], list[Access], AccessLog]:
    """Runs one request through AccessLog around `app`; returns (sent messages, records, the
    middleware). `incoming`: what receive() returns, in order (then it waits forever)."""
    sent: list[dict] = []
    records: list[Access] = []
    queue = list(incoming or [{"type": "http.request", "body": b"{}", "more_body": False}])

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()
        raise AssertionError  # pragma: no cover

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = AccessLog(app, ROUTES, [records.append])
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": list(headers),
        "client": ("127.0.0.1", 4242),
    }

    async def run() -> None:
        try:
            await middleware(scope, receive, send)
        except RuntimeError:
            pass  # the app's own failure, raised on past the middleware

    asyncio.run(run())
    return sent, records, middleware


async def reply_json(scope: dict, receive: Callable, send: Callable) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def test_a_callers_id_is_kept_and_sent_back_and_a_bad_one_replaced() -> None:
    seen: list[str] = []

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        seen.append(access_of(scope).request_id)  # what the route passes to the gRPC call
        await reply_json(scope, receive, send)

    sent, (record,), _ = serve(app, [(b"x-request-id", b"trace-42")])
    assert seen == ["trace-42"] == [record.request_id]
    assert (b"x-request-id", b"trace-42") in sent[0]["headers"]
    sent, (record,), _ = serve(app, [(b"x-request-id", b"y" * 200)])
    assert len(record.request_id) == 32 and record.request_id == seen[-1]  # made here
    assert (b"x-request-id", record.request_id.encode()) in sent[0]["headers"]


def test_a_plain_reply_is_recorded_once_with_its_status_and_body_bytes() -> None:
    body = [
        {"type": "http.request", "body": b"x" * 300, "more_body": True},
        {"type": "http.request", "body": b"y" * 200, "more_body": False},
    ]
    _, (record,), middleware = serve(reply_json, incoming=body)
    assert record.outcome == 200 and record.complete and not record.disconnected
    assert record.body_bytes == 500 and record.ttft is None
    assert record.route == "/v1/completions" and record.peer == "127.0.0.1:4242"
    assert record.end is not None and record.duration >= 0
    assert middleware.in_flight == 0
    _, (other,), _ = serve(reply_json, path="/v1/../secret")
    assert other.route == "other"  # labels stay bounded whatever the path


def test_a_stream_records_its_first_event_and_a_hang_up_is_499() -> None:
    async def stream(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    _, (record,), _ = serve(stream)
    assert record.outcome == 200 and record.ttft is not None and record.ttft <= record.duration

    async def abandoned(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"  # Starlette then stops the stream

    hang_up = [{"type": "http.request", "body": b"{}"}, {"type": "http.disconnect"}]
    _, (record,), _ = serve(abandoned, incoming=hang_up)
    assert record.outcome == 499 and record.disconnected and not record.complete


def test_a_failing_app_is_a_500_and_still_recorded() -> None:
    async def broken(scope: dict, receive: Callable, send: Callable) -> None:
        raise RuntimeError("bug")

    sent, (record,), middleware = serve(broken)
    assert sent == [] and record.outcome == 500 and middleware.in_flight == 0


def test_the_log_line_never_carries_the_token_or_the_prompt(caplog) -> None:
    secret, prompt = "sk-very-secret", "my private prompt"

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await reply_json(scope, receive, send)

    headers = [(b"authorization", f"Bearer {secret}".encode()), (b"x-request-id", b"id-9")]
    body = [{"type": "http.request", "body": f'{{"prompt": "{prompt}"}}'.encode()}]
    with caplog.at_level(logging.INFO, logger="nanoserve.requests"):
        _, (record,), _ = serve(app, headers, incoming=body)
        RequestLog()(record)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "nanoserve.requests"]
    assert line.startswith("request 'id-9' POST /v1/completions 200 ")
    assert secret not in line and prompt not in line


def test_metrics_count_by_route_and_status() -> None:
    from nanoserve.frontend.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    streamed = Access("a", "/v1/chat/completions", "POST", "-", start=0.0, status=200, end=2.0)
    streamed.first_event_at, streamed.body_bytes = 0.05, 700
    streamed.ended(Usage(10, 20, 0), "stop")
    refused = Access("b", "/v1/completions", "POST", "-", start=0.0, status=400, end=0.003)
    health = Access("c", "/health", "GET", "-", start=0.0, status=200, end=0.001)
    for access in (streamed, refused, refused, health):
        metrics.observe(access)
    metrics.track_in_flight(lambda: 3)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    total = "nanoserve:gateway_requests_total"
    assert sample(total, route="/v1/chat/completions", status="200") == 1
    assert sample(total, route="/v1/completions", status="400") == 2
    assert sample(total, route="/health", status="200") == 1
    duration = "nanoserve:gateway_request_duration_seconds"
    assert sample(f"{duration}_count", route="/v1/completions") == 2
    assert sample(f"{duration}_sum", route="/v1/chat/completions") == 2.0
    first = "nanoserve:gateway_time_to_first_event_seconds"
    assert sample(f"{first}_count", route="/v1/chat/completions") == 1
    assert sample(f"{first}_count", route="/v1/completions") is None  # no stream there
    body = "nanoserve:gateway_request_body_bytes"
    assert sample(f"{body}_sum", route="/v1/chat/completions") == 700
    assert sample(f"{body}_count", route="/health") is None  # a GET has no body
    assert sample("nanoserve:gateway_prompt_tokens_total", route="/v1/chat/completions") == 10
    assert sample("nanoserve:gateway_completion_tokens_total", route="/v1/chat/completions") == 20
    assert sample("nanoserve:gateway_completion_tokens_total", route="/v1/completions") is None
    assert sample("nanoserve:gateway_requests_in_flight") == 3
