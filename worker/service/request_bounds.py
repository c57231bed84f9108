"""The byte bound of a GenerateTokensRequest, checked before it is parsed (max_request_bytes);
admission.admit then counts each list before it reads it (a 15M-id prompt costs one len()).
"""

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
