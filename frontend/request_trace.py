"""The frontend's span of each Generate/Chat call (nanoserve.tracing): started by request_log.recorded
as the call arrives, the child of the caller's `traceparent` metadata; RequestRunner sends its
traceparent to the worker in the GenerateTokensRequest; ended with its phases (tokenize, admission,
detokenize) as a request sink, from the RequestRecord's timestamps.
"""

from nanoserve.frontend.request_log import RequestRecord
from nanoserve.tracing import Tracer, wall_ns

_FAILED = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS"})


class RequestTracer:
    """Ends each traced call's span: a request sink of the servicer."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __call__(self, record: RequestRecord) -> None:
        span = record.span
        if span is None:
            return
        record.span = None
        start = wall_ns(record.start)
        tokenized = record.tokenized_at
        if tokenized is not None:
            span.phase(
                "tokenize",
                start,
                wall_ns(tokenized),
                {"nanoserve.prompt_tokens": record.prompt_tokens or None},
            )
        if record.sent_at is not None:  # routed and handed to a worker
            span.phase(
                "admission",
                wall_ns(tokenized if tokenized is not None else record.start),
                wall_ns(record.sent_at),
            )
        end = wall_ns(record.end) if record.end is not None else None
        if record.first_token_at is not None:
            first = wall_ns(record.first_token_at)
            span.event("first_token", first)
            # the ids are detokenized (stop strings matched) and sent as they come, until the end
            span.phase(
                "detokenize",
                first,
                end if end is not None else first,
                {
                    "nanoserve.completion_tokens": record.completion_tokens,
                    "nanoserve.detokenize_cpu_s": round(record.detokenize_s, 6),
                },
            )
        span.end(
            end,
            {
                "rpc.method": record.method,
                "rpc.grpc.status_code": record.code,
                "nanoserve.request_id": record.request_id,
                "nanoserve.prompt_tokens": record.prompt_tokens,
                "nanoserve.completion_tokens": record.completion_tokens,
                "nanoserve.cached_tokens": record.cached_tokens,
                "nanoserve.finish_reason": record.finish_reason,
            },
            error=record.code if record.code in _FAILED else None,
        )
