"""Size checks of a GenerateTokensRequest, run by WorkerService before any list in it is copied or
walked: a 15M-id prompt or 3M stop ids cost one len() each, then INVALID_ARGUMENT naming the field.
The engine's own validate() checks values (ids in the vocabulary, max_tokens) on what is left.
"""

from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling_rules import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS

DEFAULT_MAX_STOP_TOKEN_IDS = 128
MAX_REQUEST_ID_LENGTH = 128
MAX_CACHE_SALT_LENGTH = 256  # the frontend sends a 64-character digest of the tenant
_VARINT_BYTES = 5  # the most a uint32 token id takes on the wire
_REQUEST_OVERHEAD_BYTES = 64 * 1024  # request id, sampling parameters, tags
# a logit_bias entry: its tag and length, the key's tag and varint, the value's tag and float
_LOGIT_BIAS_ENTRY_BYTES = 1 + 1 + 1 + _VARINT_BYTES + 1 + 4
_TOKEN_RULES_BYTES = (
    MAX_LOGIT_BIAS * _LOGIT_BIAS_ENTRY_BYTES + MAX_ALLOWED_TOKEN_IDS * _VARINT_BYTES
)


def max_request_bytes(max_model_len: int, max_stop_token_ids: int) -> int:
    """No valid GenerateTokensRequest is larger: DecodeErrorInterceptor refuses larger ones
    unparsed (parsing 15M ids would hold the worker's event loop, and its engine, ~0.1-0.3 s).
    The largest logit_bias and allowed_token_ids add 333 KiB."""
    return (
        (max_model_len + max_stop_token_ids) * _VARINT_BYTES
        + _TOKEN_RULES_BYTES
        + _REQUEST_OVERHEAD_BYTES
    )


def check_request_sizes(
    request: worker_pb2.GenerateTokensRequest,
    max_model_len: int,
    max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS,
) -> None:
    """Raises InvalidArgument when a list or string of the request is past its bound."""
    check_list_sizes(request, max_model_len, max_stop_token_ids)
    if len(request.request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(f"longer than {MAX_REQUEST_ID_LENGTH} characters", field="request_id")


def check_list_sizes(
    request: worker_pb2.GenerateTokensRequest, max_model_len: int, max_stop_token_ids: int
) -> None:
    """The prompt ids, stop ids, logit_bias, allowed_token_ids and cache salt by their length
    alone (Session adds: their request ids have the session's own bound, as the frontend suffixes
    the client's id)."""
    num_ids = len(request.prompt_token_ids)
    if num_ids >= max_model_len:
        raise InvalidArgument(
            f"the prompt has {num_ids} tokens; max_model_len is {max_model_len} "
            "(room for 1 new token needed)",
            field="prompt_token_ids",
        )
    num_stop = len(request.sampling_params.stop_token_ids)
    if num_stop > max_stop_token_ids:
        raise InvalidArgument(
            f"at most {max_stop_token_ids} stop token ids, got {num_stop}",
            field="sampling_params.stop_token_ids",
        )
    num_bias = len(request.sampling_params.logit_bias)
    if num_bias > MAX_LOGIT_BIAS:
        raise InvalidArgument(
            f"at most {MAX_LOGIT_BIAS} entries, got {num_bias}", field="sampling_params.logit_bias"
        )
    num_allowed = len(request.sampling_params.allowed_token_ids)
    if num_allowed > MAX_ALLOWED_TOKEN_IDS:
        raise InvalidArgument(
            f"at most {MAX_ALLOWED_TOKEN_IDS} ids, got {num_allowed}",
            field="sampling_params.allowed_token_ids",
        )
    if len(request.cache_salt) > MAX_CACHE_SALT_LENGTH:
        raise InvalidArgument(f"longer than {MAX_CACHE_SALT_LENGTH} characters", field="cache_salt")
