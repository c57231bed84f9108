"""OpenTelemetry traces of requests across the processes: gateway -> frontend -> worker -> engine core.

Each service makes one span per request (a child of the caller's W3C `traceparent`: an HTTP header,
gRPC metadata, a GenerateTokensRequest field, an engine-core frame element) and its phases as child
spans built from timestamps the service keeps anyway, exported over OTLP/gRPC by the OpenTelemetry
SDK. Off unless an endpoint is configured: then `tracer_for` returns None, no span is made and the
SDK is never imported.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

TRACEPARENT = "traceparent"  # the W3C header / gRPC metadata key (lower case, as gRPC wants)
# version 00: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters; later versions may append fields
MAX_TRACEPARENT_CHARS = 128
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-f-]*)?")
TRACES_HELP = (
    "OTLP/gRPC endpoint (host:port, or http[s]://host:port) to export OpenTelemetry traces of "
    "requests to; empty = no tracing, at no cost. A client's W3C `traceparent` (HTTP header or "
    "gRPC metadata) becomes the parent of this service's spans"
)


def traceparent_from(value: str | bytes | None) -> str | None:
    """A caller's traceparent when it is well formed (bounded before it is looked at), else None:
    a malformed one starts a new trace, as the W3C recommendation says, and is never an error."""
    if value is None or len(value) > MAX_TRACEPARENT_CHARS:
        return None
    if isinstance(value, bytes):
        if not value.isascii():
            return None
        value = value.decode("ascii")
    value = value.strip().lower()
    if not _TRACEPARENT.fullmatch(value) or value.startswith("ff"):
        return None
    if value.startswith("00") and len(value) != 55:  # version 00 has exactly four fields
        return None
    _, trace_id, span_id, _ = value.split("-", 3)
    if trace_id == "0" * 32 or span_id == "0" * 16:  # invalid ids (W3C): a new trace
        return None
    return value


def traceparent_in(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The traceparent of a gRPC call's invocation metadata (None when absent or malformed)."""
    for key, value in metadata or ():
        if key == TRACEPARENT:
            return traceparent_from(value)
    return None


def wall_ns(perf_counter_s: float) -> int:
    """A time.perf_counter() reading as Unix epoch nanoseconds (what spans carry)."""
    return time.time_ns() - int((time.perf_counter() - perf_counter_s) * 1e9)


def wall_ns_of_monotonic(monotonic_s: float) -> int:
    """A time.monotonic() reading as Unix epoch nanoseconds."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class RequestSpan:
    """One request's span in this process; `traceparent` names it to the next process."""

    __slots__ = ("_context", "_span", "_tracer")

    def __init__(self, tracer: Any, span: Any, context: Any) -> None:
        self._tracer, self._span, self._context = tracer, span, context

    @property
    def traceparent(self) -> str:
        ctx = self._span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any] | None = None
    ) -> None:
        """A child span of a phase that is over (its times known)."""
        child = self._tracer.start_span(
            name, context=self._context, start_time=start_ns, attributes=attributes
        )
        child.end(end_time=max(end_ns, start_ns))

    def event(self, name: str, at_ns: int) -> None:
        self._span.add_event(name, timestamp=at_ns)

    def end(
        self,
        end_ns: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        if attributes:
            self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end(end_time=end_ns)


class Tracer:
    """This process's OpenTelemetry tracer, exporting in batches from a thread of the SDK's."""

    def __init__(self, service_name: str, endpoint: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as e:
            raise ImportError(
                f"{e}: --otlp-traces-endpoint needs pip install 'nanoserve[tracing]'"
            ) from None

        insecure = not endpoint.startswith("https://")
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))
        )
        self._tracer = self.provider.get_tracer("nanoserve")

    def start(
        self,
        name: str,
        traceparent: str | None,
        start_ns: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        server: bool = True,
    ) -> RequestSpan:
        """A request's span, the child of `traceparent` (None: the root of a new trace)."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = (
            TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})
            if traceparent
            else None
        )
        kind = trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL
        span = self._tracer.start_span(
            name, context=parent, kind=kind, start_time=start_ns, attributes=attributes
        )
        return RequestSpan(self._tracer, span, trace.set_span_in_context(span))

    def shutdown(self) -> None:
        """Exports what is left (at most a few seconds) and stops the exporting thread."""
        self.provider.shutdown()


def tracer_for(service_name: str, endpoint: str) -> Tracer | None:
    """The process's tracer, or None when no endpoint is configured (tracing off)."""
    return Tracer(service_name, endpoint) if endpoint else None
