"""Size bounds of a GenerateTokensRequest, before any list in it is copied or walked: unparsed by
its bytes (max_request_bytes), then the prompt and cache salt by their length (a 15M-id prompt
costs one len()); request_proto.admit checks the rest with the sampling schema.
"""

from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS

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


def check_list_sizes(request: worker_pb2.GenerateTokensRequest, max_model_len: int) -> None:
    """The prompt ids and the cache salt by their length alone (the sampling lists:
    sampling_proto.from_proto); InvalidArgument naming the field."""
    num_ids = len(request.prompt_token_ids)
    if num_ids >= max_model_len:
        raise InvalidArgument(
            f"the prompt has {num_ids} tokens; max_model_len is {max_model_len} "
            "(room for 1 new token needed)",
            field="prompt_token_ids",
        )
    if len(request.cache_salt) > MAX_CACHE_SALT_LENGTH:
        raise InvalidArgument(f"longer than {MAX_CACHE_SALT_LENGTH} characters", field="cache_salt")
