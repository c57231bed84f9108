"""`python -m nanoserve.benchmarks.metrics_cost`: what recording one ended request costs on the
frontend's event loop (FrontendMetrics.observe and the request log line) and on the gateway's
(AccessLog, GatewayMetrics.observe, its log line; with the gateway extra installed), and what one
/metrics scrape of each service costs. Compare with the frontend's per-message cost (~55-65 us,
reviews). Prints figures, asserts nothing.
"""

import argparse
import json
import logging
import time

from prometheus_client import generate_latest

from nanoserve.frontend.metrics import FrontendMetrics
from nanoserve.frontend.request_log import RequestLog, RequestRecord
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.worker.core.frames import Finish
from nanoserve.worker.service.metrics import EngineHistograms, WorkerLoad, worker_registry


def ended_request(num_chunks: int) -> RequestRecord:
    record = RequestRecord("bench", "Generate", "ipv4:127.0.0.1:1", start=time.perf_counter())
    for _ in range(num_chunks - 1):
        record.add(frontend_pb2.GenerateResponse(token_ids=[1]))
    last = frontend_pb2.GenerateResponse(
        token_ids=[2], finish_reason=common_pb2.FINISH_REASON_LENGTH
    )
    last.usage.prompt_tokens, last.usage.completion_tokens = 100, num_chunks
    record.add(last)
    record.code, record.end = "OK", time.perf_counter()
    return record


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - start) / n


def gateway_figures(n: int) -> dict[str, float]:
    """The gateway's per-request cost: AccessLog around an ASGI app that never waits (run by
    hand, no event loop), less that app alone; its sinks one by one; a /metrics scrape."""
    try:
        from nanoserve.client.messages import Usage
        from nanoserve.frontend.gateway.access import Access, AccessLog, RequestLog
        from nanoserve.frontend.gateway.metrics import GatewayMetrics
    except ImportError:  # no gateway extra (fastapi)
        return {}

    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    message = {"type": "http.request", "body": b"{}", "more_body": False}

    async def receive():
        return message

    async def send(message) -> None:
        pass

    headers = [(b"host", b"gw"), (b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    given = {**scope, "headers": [*headers, (b"x-request-id", b"trace-0123456789")]}

    def run(asgi, scope: dict) -> None:
        try:
            asgi(dict(scope), receive, send).send(None)
        except StopIteration:
            pass

    metrics, log = GatewayMetrics(), RequestLog()
    middleware = AccessLog(app, ["/v1/chat/completions"], [])
    access = Access("bench", "/v1/chat/completions", "POST", "127.0.0.1:1", start=0.0, end=1.5)
    access.status, access.first_event_at, access.body_bytes = 200, 0.1, 500
    access.ended(Usage(100, 128, 0), "length")
    bare = per_call_us(lambda: run(app, scope), n)
    return dict(
        gateway_access_per_request_us=round(
            per_call_us(lambda: run(middleware, scope), n) - bare, 2
        ),
        gateway_access_given_id_per_request_us=round(
            per_call_us(lambda: run(middleware, given), n) - bare, 2
        ),
        gateway_observe_per_request_us=round(per_call_us(lambda: metrics.observe(access), n), 2),
        gateway_log_per_request_us=round(per_call_us(lambda: log(access), n), 2),
        gateway_scrape_ms=round(
            per_call_us(lambda: generate_latest(metrics.registry), 200) / 1e3, 3
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench metrics-cost", description=__doc__)
    p.add_argument(
        "--requests",
        type=int,
        default=20_000,
        help="ended requests recorded, to average over (default: 20000)",
    )
    p.add_argument(
        "--tokens", type=int, default=128, help="streamed chunks per request (default: 128)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.getLogger("nanoserve.requests").addHandler(logging.NullHandler())
    logging.getLogger("nanoserve.requests").propagate = False
    logging.getLogger("nanoserve.requests").setLevel(logging.INFO)
    record = ended_request(args.tokens)
    metrics = FrontendMetrics("bench")
    chunk = frontend_pb2.GenerateResponse(token_ids=[1])
    fresh = RequestRecord("bench", "Generate", "peer")
    text_log, json_log = RequestLog("text"), RequestLog("json")
    for _ in range(200):  # populate the histograms' label children
        metrics.observe(record)
    load = WorkerLoad(8, 2, 300, 512, 10_000, 4_000, 3, 9_000, 50_000, 600)
    worker = worker_registry("bench", lambda: load)
    histograms = EngineHistograms("bench", worker)
    finish = Finish("length", 100, 128, 0, None, 0.01, 0.05, 1.5)
    res = dict(
        bench="metrics_cost",
        record_add_per_chunk_us=round(per_call_us(lambda: fresh.add(chunk), args.requests), 3),
        observe_per_request_us=round(
            per_call_us(lambda: metrics.observe(record), args.requests), 2
        ),
        log_text_per_request_us=round(per_call_us(lambda: text_log(record), args.requests), 2),
        log_json_per_request_us=round(per_call_us(lambda: json_log(record), args.requests), 2),
        frontend_scrape_ms=round(
            per_call_us(lambda: generate_latest(metrics.registry), 200) / 1e3, 3
        ),
        # the worker's event loop, as each engine step's frame arrives and as a request finishes
        engine_step_observe_us=round(
            per_call_us(lambda: histograms.observe_step(256, 256, 0.012), args.requests), 2
        ),
        engine_finish_observe_us=round(
            per_call_us(lambda: histograms.observe_finish(finish), args.requests), 2
        ),
        worker_scrape_ms=round(per_call_us(lambda: generate_latest(worker), 200) / 1e3, 3),
        **gateway_figures(args.requests),
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
