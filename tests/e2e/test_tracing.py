"""OpenTelemetry traces across the four processes (issue 33): a real OTLP/gRPC receiver runs in this
test process; the gateway, the frontend and the worker (with its engine core) export to it. One
request's spans must form one tree under the caller's traceparent: gateway -> frontend -> worker ->
engine core, each with its phases, their token counts equal to the reply's usage."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_service
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from nanoserve.client import Client
from tests.e2e.gateway_process import MESSAGES, base_url, request_json, start_gateway
from tests.e2e.processes import Service, start_pair

SERVICES = ("nanoserve-gateway", "nanoserve-frontend", "nanoserve-worker", "nanoserve-engine-core")
SLACK_NS = 5_000_000  # clocks of different processes, each converted to the epoch: 5 ms


@dataclass
class Span:
    service: str
    name: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict
    events: list[str]


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace collector: keeps every span it is sent, by trace id."""

    def __init__(self) -> None:
        self.spans: dict[str, list[Span]] = {}
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.setdefault(s.trace_id.hex(), []).append(
                            Span(
                                service,
                                s.name,
                                s.span_id.hex(),
                                s.parent_span_id.hex(),
                                s.start_time_unix_nano,
                                s.end_time_unix_nano,
                                {a.key: _value(a.value) for a in s.attributes},
                                [e.name for e in s.events],
                            )
                        )
        return trace_service.ExportTraceServiceResponse()

    def wait(self, trace_id: str, count: int, timeout: float = 30.0) -> list[Span]:
        """The trace's spans once `count` of them came (the exporters send in batches)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans.get(trace_id, ()))
            if len(spans) >= count:
                time.sleep(0.3)  # a straggler would be a defect: let it show
                with self.lock:
                    return list(self.spans[trace_id])
            time.sleep(0.05)
        raise AssertionError(f"{len(spans)} of {count} spans of {trace_id}: {spans}")


def _value(v):
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


@dataclass
class Stack:
    receiver: Receiver
    gateway: Service
    frontend: Service
    model: str  # the name the gateway serves


@pytest.fixture(scope="module")
def traced(tiny_model_dir: Path) -> Iterator[Stack]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    flag = ("--otlp-traces-endpoint", f"127.0.0.1:{port}")
    saved = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # the SDK's batch delay (5 s by default)
    try:
        pair = start_pair(tiny_model_dir, flag, flag)
    finally:
        if saved is None:
            del os.environ["OTEL_BSP_SCHEDULE_DELAY"]
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = saved
    try:
        gateway = start_gateway(pair.frontend.address, *flag)
    except BaseException:
        pair.stop()
        raise
    status, models = request_json("GET", base_url(gateway) + "/v1/models")
    assert status == 200, models
    yield Stack(receiver, gateway, pair.frontend, models["data"][0]["id"])
    assert gateway.stop() == 0, gateway.output()
    assert pair.stop() == (0, 0)
    server.stop(0)


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _sse_chat(stack: Stack, headers: dict[str, str]) -> dict:
    """A streamed chat completion; its usage (the last chunk's)."""
    body = {
        "model": stack.model,
        "messages": MESSAGES,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{base_url(stack.gateway)}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    usage = None
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            text = line.decode().strip()
            if text.startswith("data: {"):
                usage = json.loads(text[6:]).get("usage") or usage
    assert usage is not None
    return usage


def _one(spans: list[Span], service: str, name: str) -> Span:
    (span,) = [s for s in spans if s.service == service and s.name == name]
    return span


def _children(spans: list[Span], parent: Span) -> dict[str, Span]:
    return {s.name: s for s in spans if s.parent_id == parent.span_id}


def _inside(child: Span, parent: Span) -> None:
    assert parent.start - SLACK_NS <= child.start <= child.end <= parent.end + SLACK_NS, (
        child,
        parent,
    )


def test_one_requests_spans_form_one_tree_across_the_four_processes(traced: Stack) -> None:
    traceparent, trace_id, client_span = _traceparent()
    usage = _sse_chat(traced, {"traceparent": traceparent})
    # gateway: request + parse; frontend: call + tokenize, admission, detokenize; worker: one;
    # engine core: sequence + queue, prefill, decode
    spans = traced.receiver.wait(trace_id, 2 + 4 + 1 + 4)
    assert {s.service for s in spans} == set(SERVICES)

    gateway = _one(spans, "nanoserve-gateway", "POST /v1/chat/completions")
    assert gateway.parent_id == client_span  # the caller's trace, continued
    assert set(_children(spans, gateway)) == {"parse", "Chat"}
    assert "first_token" in gateway.events
    assert gateway.attributes["nanoserve.completion_tokens"] == usage["completion_tokens"]

    frontend = _one(spans, "nanoserve-frontend", "Chat")
    assert frontend.parent_id == gateway.span_id
    phases = _children(spans, frontend)
    assert {"tokenize", "admission", "detokenize", "GenerateTokens"} == set(phases)
    assert phases["tokenize"].end <= phases["admission"].start + SLACK_NS
    assert (
        phases["detokenize"].attributes["nanoserve.completion_tokens"]
        == (usage["completion_tokens"])
    )
    assert frontend.attributes["nanoserve.prompt_tokens"] == usage["prompt_tokens"]
    assert "first_token" in frontend.events

    worker = phases["GenerateTokens"]
    assert worker.service == "nanoserve-worker"
    assert worker.attributes["nanoserve.prompt_tokens"] == usage["prompt_tokens"]
    assert worker.attributes["nanoserve.completion_tokens"] == usage["completion_tokens"]

    engine = _one(spans, "nanoserve-engine-core", "engine")
    assert engine.parent_id == worker.span_id
    stages = _children(spans, engine)
    assert set(stages) == {"queue", "prefill", "decode"}
    assert stages["prefill"].attributes["nanoserve.prompt_tokens"] == usage["prompt_tokens"]
    assert (
        stages["decode"].attributes["nanoserve.completion_tokens"] == (usage["completion_tokens"])
    )
    assert "first_token" in engine.events
    # each phase inside its span, each span inside its caller's
    for parent, children in ((gateway, _children(spans, gateway)), (frontend, phases)):
        for child in children.values():
            _inside(child, parent)
    for child in stages.values():
        _inside(child, engine)
    _inside(engine, worker)


def test_a_grpc_callers_traceparent_is_the_parent_of_the_frontends_span(traced: Stack) -> None:
    traceparent, trace_id, client_span = _traceparent()
    with Client(traced.frontend.address) as client:
        chunks = list(
            client._stub.Generate(  # the public RPC with metadata, as any gRPC client sends it
                _generate_request(), metadata=(("traceparent", traceparent),), timeout=60
            )
        )
    assert chunks
    spans = traced.receiver.wait(trace_id, 4 + 1 + 4)
    frontend = _one(spans, "nanoserve-frontend", "Generate")
    assert frontend.parent_id == client_span
    worker = _one(spans, "nanoserve-worker", "GenerateTokens")
    assert worker.parent_id == frontend.span_id
    assert _one(spans, "nanoserve-engine-core", "engine").parent_id == worker.span_id


def _generate_request():
    from nanoserve.client.requests import generate_request

    return generate_request("Once upon a time", "", None, None, max_tokens=4)


@pytest.mark.parametrize(
    "header",
    ["garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "00-" + "ab" * 2000],
    ids=["garbage", "zero-trace-id", "oversized"],
)
def test_a_malformed_traceparent_starts_a_new_trace(traced: Stack, header: str) -> None:
    """A bad header is no error: the request is served and its trace starts at the gateway."""
    marker = secrets.token_hex(8)
    usage = _sse_chat(traced, {"traceparent": header, "X-Request-Id": f"bad-{marker}"})
    assert usage["completion_tokens"] > 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with traced.receiver.lock:
            roots = [
                s
                for spans in traced.receiver.spans.values()
                for s in spans
                if s.attributes.get("nanoserve.request_id") == f"bad-{marker}"
                and s.service == "nanoserve-gateway"
            ]
        if roots:
            break
        time.sleep(0.05)
    (root,) = roots
    assert root.parent_id == ""


def test_each_completion_and_an_abandoned_request_leave_their_spans(traced: Stack) -> None:
    """n = 2: one engine span per completion under the worker's; a stream the client cancels
    after its first output: the worker's span says aborted, the engine's finish reason is abort
    (their spans end when the request does, not never)."""
    from nanoserve.client.requests import generate_request

    traceparent, trace_id, _ = _traceparent()
    with Client(traced.frontend.address) as client:
        request = generate_request("Once upon a time", "", None, None, max_tokens=4, n=2, seed=1)
        list(client._stub.Generate(request, metadata=(("traceparent", traceparent),), timeout=60))
    spans = traced.receiver.wait(trace_id, 4 + 1 + 2 * 4)
    worker = _one(spans, "nanoserve-worker", "GenerateTokens")
    engines = [s for s in spans if s.name == "engine"]
    assert sorted(s.attributes["nanoserve.index"] for s in engines) == [0, 1]
    assert all(s.parent_id == worker.span_id for s in engines)
    assert worker.attributes["nanoserve.completion_tokens"] == 8

    traceparent, trace_id, _ = _traceparent()
    with Client(traced.frontend.address) as client:
        request = generate_request("Once upon a time", "", None, None, max_tokens=3000)
        request.sampling_params.ignore_eos = True
        call = client._stub.Generate(request, metadata=(("traceparent", traceparent),), timeout=60)
        next(call)
        call.cancel()
    spans = traced.receiver.wait(trace_id, 1 + 1 + 1)  # frontend, worker, engine at least
    worker = _one(spans, "nanoserve-worker", "GenerateTokens")
    assert worker.attributes.get("nanoserve.aborted") is True
    engine = _one(spans, "nanoserve-engine-core", "engine")
    assert engine.attributes["nanoserve.finish_reason"] == "abort"
    assert _one(spans, "nanoserve-frontend", "Generate").attributes["rpc.grpc.status_code"] == (
        "CANCELLED"
    )


def test_oversized_traceparents_are_dropped_unread_beside_a_health_prober(traced: Stack) -> None:
    """A burst of calls whose traceparent is 6 KB of near-valid text (gRPC metadata) and of
    requests with a 12 KB one (HTTP header): all served, as new traces, health stays fast."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.e2e.processes import FRONTEND_SERVICE
    from tests.e2e.test_hostile_clients_inputs import HealthProber

    huge = "00-" + "ab" * 3000
    with (
        HealthProber({traced.frontend.address: FRONTEND_SERVICE}) as prober,
        Client(traced.frontend.address) as client,
    ):

        def grpc_call(_: int) -> int:
            metadata = (("traceparent", huge),)
            chunks = client._stub.Generate(_generate_request(), metadata=metadata, timeout=60)
            return sum(len(c.token_ids) for c in chunks)

        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(grpc_call, range(64))) == [4] * 64
            usages = list(
                pool.map(lambda _: _sse_chat(traced, {"traceparent": huge * 2}), range(8))
            )
        assert all(u["completion_tokens"] > 0 for u in usages)
    assert prober.worst()[traced.frontend.address] < 1.0, prober.worst()
