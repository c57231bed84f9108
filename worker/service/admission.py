"""The worker's door: a GenerateTokensRequest checked and handed to the engine (admit), its finish
and usage out, and the status a stream ends with when its request did not finish. Used by
GenerateTokens and Session alike.
"""

from nanoserve.errors import Aborted, InvalidArgument, ResourceExhausted, ServiceError, Unavailable
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import SamplingError, check_prompt, resolve_max_tokens
from nanoserve.sampling_proto import from_proto
from nanoserve.wire import FINISH_REASON_OF
from nanoserve.worker.core.frames import Finish
from nanoserve.worker.service.async_engine import AsyncEngine, RequestAborted, RequestInvalid
from nanoserve.worker.service.output_stream import Collector, Stream
from nanoserve.worker.service.request_bounds import MAX_CACHE_SALT_LENGTH


def set_finish(response, finish: Finish) -> None:
    """The last message of a request: finish reason, usage and the stop token that ended it."""
    response.finish_reason = FINISH_REASON_OF[finish.reason]  # a FinishReason value
    response.usage.prompt_tokens = finish.prompt_tokens
    response.usage.completion_tokens = finish.completion_tokens
    response.usage.cached_tokens = finish.cached_tokens
    if finish.stop_token_id is not None:
        response.stop_token_id = finish.stop_token_id


def add_logprobs(
    repeated,
    entries: list[list] | None,  # a response's repeated TokenLogprobs field
) -> None:
    """Engine entries [token_id, logprob, rank, top_ids, top_logprobs] -> TokenLogprobs."""
    for token_id, logprob, rank, top_ids, top_logprobs in entries or ():
        repeated.add(
            token_id=token_id,
            logprob=logprob,
            rank=rank,
            top_logprobs=[
                common_pb2.TokenLogprob(token_id=t, logprob=lp)
                for t, lp in zip(top_ids, top_logprobs)
            ],
        )


def stream_error(error: Exception) -> ServiceError:
    """The status that ends a stream whose request was aborted, refused, or whose engine died."""
    if isinstance(error, RequestAborted):
        return Aborted(str(error))
    if isinstance(error, RequestInvalid):
        return InvalidArgument(str(error))
    return Unavailable(f"the engine failed: {error}")


def admit(
    engine: AsyncEngine,
    request: worker_pb2.GenerateTokensRequest,
    request_id: str,
    max_queued_requests: int,
    owner: Collector | None = None,
    traceparent: str | None = None,
) -> Stream:
    """The worker's one door for a request (GenerateTokens and Session alike): the queue bound,
    each list by its length before it is read, the sampling schema against the limits the engine
    core reported;
    then the core, which trusts what passed. A refusal is a ServiceError naming the field."""
    if engine.num_requests >= max_queued_requests:
        raise ResourceExhausted(
            f"{engine.num_requests} requests are in flight "
            f"(max_queued_requests={max_queued_requests})"
        )
    if len(request.cache_salt) > MAX_CACHE_SALT_LENGTH:
        raise InvalidArgument(f"longer than {MAX_CACHE_SALT_LENGTH} characters", field="cache_salt")
    limits = engine.limits
    try:
        check_prompt(request.prompt_token_ids, limits)  # counted, then read by min/max in C
        sp = from_proto(request.sampling_params, limits, frontend=False)
        token_ids = list(request.prompt_token_ids)
        # unset max_tokens stays None: the engine fills the context
        resolve_max_tokens(sp.max_tokens, sp.min_tokens, len(token_ids), limits.max_model_len)
    except SamplingError as e:
        field = e.field if e.field.startswith("prompt_token_ids") else f"sampling_params.{e.field}"
        raise InvalidArgument(e.problem, field=field) from None
    try:
        return engine.add(
            request_id,
            token_ids,
            sp,
            owner=owner,
            cache_salt=request.cache_salt,
            priority=request.priority,
            traceparent=traceparent,
        )
    except ValueError as e:  # a request id already running
        raise InvalidArgument(str(e)) from None
