"""A request's proto forms and the engine's: sampling params in, finish and usage out, and the
status a stream ends with when its request did not finish. Used by GenerateTokens and Session.
"""

from nanoserve.errors import Aborted, InvalidArgument, ServiceError, Unavailable
from nanoserve.proto.v1 import common_pb2
from nanoserve.structured_output import from_proto as structured_output_from_proto
from nanoserve.worker.async_engine import Finish, RequestAborted, RequestInvalid
from nanoserve.worker.engine.sequence import FinishReason
from nanoserve.worker.sampling_params import SamplingParams

_FINISH = {
    FinishReason.STOP.value: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH.value: common_pb2.FINISH_REASON_LENGTH,
}

_LOGPROBS_MODES = {
    common_pb2.LOGPROBS_MODE_UNSPECIFIED: "raw",
    common_pb2.LOGPROBS_MODE_RAW: "raw",
    common_pb2.LOGPROBS_MODE_PROCESSED: "processed",
}


def set_finish(response, finish: Finish) -> None:
    """The last message of a request: finish reason, usage and the stop token that ended it."""
    response.finish_reason = _FINISH[finish.reason]
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


def sampling_params_from_proto(
    p: common_pb2.SamplingParams, prompt_len: int, max_model_len: int
) -> SamplingParams:
    """Proto -> engine params; unset fields take vLLM's defaults, bad values raise ValueError."""
    kw = {
        name: getattr(p, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "max_tokens",
            "min_tokens",
            "ignore_eos",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "n",
            "logprobs",
            "prompt_logprobs",
        )
        if p.HasField(name)
    }
    if p.logprobs_mode not in _LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode: unknown value {p.logprobs_mode}")
    kw["logprobs_mode"] = _LOGPROBS_MODES[p.logprobs_mode]
    kw.setdefault("max_tokens", max(1, max_model_len - prompt_len))  # unset: fill the context
    if p.HasField("structured_output"):
        kw["structured_output"] = structured_output_from_proto(p.structured_output)
    # empty is unset (proto3); their lengths were checked before (worker.validation)
    if p.logit_bias:
        kw["logit_bias"] = dict(p.logit_bias)
    if p.allowed_token_ids:
        kw["allowed_token_ids"] = tuple(p.allowed_token_ids)
    return SamplingParams(stop_token_ids=tuple(p.stop_token_ids), **kw)
