"""The worker gRPC process's span of each request (nanoserve.tracing): started by AsyncEngine.add as
the child of the caller's traceparent (the frontend's span), named to the engine core in the add
frame (worker.core.sequence_trace makes the core's spans its children), ended when the request does.
"""

from nanoserve.tracing import RequestSpan, Tracer
from nanoserve.worker.service.output_stream import Stream


def start_request_span(
    tracer: Tracer, request_id: str, num_prompt_tokens: int, n: int, traceparent: str | None
) -> RequestSpan:
    return tracer.start(
        "GenerateTokens",
        traceparent,
        attributes={
            "nanoserve.request_id": request_id,
            "nanoserve.prompt_tokens": num_prompt_tokens,
            "nanoserve.n": n,
        },
    )


def end_request_span(stream: Stream, aborted: bool = False, error: str | None = None) -> None:
    """The stream's span ends (once; a stream without one is left alone): with what its
    completions finished as, or why it did not."""
    span, stream.span = stream.span, None
    if span is None:
        return
    finishes = [c.finish for c in stream.completions if c.finish is not None]
    span.end(
        attributes={
            "nanoserve.completion_tokens": sum(f.completion_tokens for f in finishes),
            "nanoserve.cached_tokens": stream.cached_tokens,
            "nanoserve.finish_reason": ",".join(f.reason for f in finishes) or None,
            "nanoserve.aborted": aborted or None,
        },
        error=error,
    )
