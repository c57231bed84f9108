"""The engine core's span of a traced request's sequence (nanoserve.tracing): built when the sequence
ends, a child of the worker gRPC process's span, from the marks the Sequence keeps (arrival, first
scheduled, first token, finish): its phases are queue, prefill and decode.
"""

from typing import TYPE_CHECKING

from nanoserve.tracing import Tracer, wall_ns_of_monotonic

if TYPE_CHECKING:  # the engine core imports torch; the module stays light for the gRPC process
    from nanoserve.worker.sequence import Sequence


def trace_sequence(
    tracer: Tracer, traceparent: str, seq: "Sequence", aborted: bool = False
) -> None:
    """One span per completion (SamplingParams.n): `aborted` when its caller ended it early."""
    arrival = wall_ns_of_monotonic(seq.arrival_time)
    scheduled = seq.first_scheduled_time
    first_token = seq.first_token_time
    end = wall_ns_of_monotonic(seq.finished_time) if seq.finished_time else None
    span = tracer.start("engine", traceparent, start_ns=arrival, server=False)
    if scheduled is not None:
        scheduled_ns = wall_ns_of_monotonic(scheduled)
        span.phase("queue", arrival, scheduled_ns)
        prefill_end = wall_ns_of_monotonic(first_token) if first_token is not None else end
        span.phase(
            "prefill",
            scheduled_ns,
            prefill_end or scheduled_ns,
            {
                "nanoserve.prompt_tokens": seq.num_prompt_tokens,
                "nanoserve.cached_tokens": seq.num_cached_tokens,
            },
        )
        if first_token is not None:
            first_ns = wall_ns_of_monotonic(first_token)
            span.event("first_token", first_ns)
            span.phase(
                "decode",
                first_ns,
                end or first_ns,
                {"nanoserve.completion_tokens": seq.num_completion_tokens},
            )
    finish = seq.finish_reason
    span.end(
        end,
        {
            "nanoserve.index": seq.index,
            "nanoserve.prompt_tokens": seq.num_prompt_tokens,
            "nanoserve.cached_tokens": seq.num_cached_tokens,
            "nanoserve.completion_tokens": seq.num_completion_tokens,
            "nanoserve.finish_reason": "abort" if aborted else (finish.value if finish else None),
        },
        error=seq.error,
    )
