"""The gateway's span of each completion request (nanoserve.tracing): started by AccessLog when the
request arrives, the child of the caller's `traceparent` header; the routes send its traceparent
to the frontend as gRPC metadata and mark the end of parsing; ended, with its phases, as a sink of
the request's Access record.
"""

from collections.abc import Iterable

from nanoserve.frontend.gateway.access import Access
from nanoserve.tracing import TRACEPARENT, Tracer, traceparent_from, wall_ns

TRACED_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
_HEADER = TRACEPARENT.encode("ascii")


class RequestTracer:
    """Starts and ends the gateway's spans: one per completion request, `parse` and the first
    streamed event inside it."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def start(self, access: Access, headers: Iterable[tuple[bytes, bytes]]) -> None:
        if access.route not in TRACED_ROUTES:
            return
        parent = None
        for name, value in headers:
            if name == _HEADER:
                parent = traceparent_from(value)
                break
        access.span = self.tracer.start(
            f"{access.method} {access.route}",
            parent,
            start_ns=wall_ns(access.start),
            attributes={"http.route": access.route, "nanoserve.request_id": access.request_id},
        )

    def __call__(self, access: Access) -> None:
        """The request ended: its span, with `parse` (arrival to the mapped body) and the first
        event, and what the route learned (usage, finish reason)."""
        span = access.span
        if span is None:
            return
        access.span = None
        start = wall_ns(access.start)
        if access.parsed_at is not None:
            span.phase(
                "parse", start, wall_ns(access.parsed_at), {"http.body_bytes": access.body_bytes}
            )
        if access.first_event_at is not None:
            span.event("first_token", wall_ns(access.first_event_at))
        outcome = access.outcome
        span.end(
            wall_ns(access.end) if access.end is not None else None,
            {
                "http.status_code": outcome,
                "nanoserve.prompt_tokens": access.prompt_tokens,
                "nanoserve.completion_tokens": access.completion_tokens,
                "nanoserve.finish_reason": access.finish_reason,
            },
            error=f"HTTP {outcome}" if outcome >= 500 else None,
        )
