"""Checks every field of a public request before anything reaches the worker.

Each check raises shared.errors.InvalidArgument naming the offending field (status
INVALID_ARGUMENT); the servicer calls these before admission and tokenization costs anything.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve import sampling
from nanoserve.errors import InvalidArgument, echo
from nanoserve.proto.v1 import common_pb2
from nanoserve.sampling import SamplingError, SamplingParams, check_prompt
from nanoserve.sampling_proto import from_proto
from nanoserve.wire import MAX_REQUEST_ID_LENGTH, MAX_STREAM_INTERVAL

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_ROLE_LENGTH = 32  # longer than any of CHAT_ROLES: refused before the role is compared or echoed
DEFAULT_MAX_CHAT_MESSAGES = 4096  # FrontendConfig.max_chat_messages's default


@dataclass(frozen=True, slots=True)
class Limits(sampling.Limits):
    """The limits requests are checked against: the worker's (GetModelInfo), the frontend's own."""

    max_prompt_bytes: int = 1 << 20
    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES


def validate_sampling_params(
    params: common_pb2.SamplingParams, limits: Limits, prefix: str = "sampling_params"
) -> SamplingParams:
    """The request's sampling params, checked by the schema (nanoserve.sampling); the error
    names the request's field."""
    try:
        return from_proto(params, limits)
    except SamplingError as e:
        raise InvalidArgument(e.problem, field=f"{prefix}.{e.field}") from None


def resolve_max_tokens(
    params: SamplingParams,
    prompt_len: int,
    limits: Limits,
    prefix: str = "sampling_params",
    prompt_field: str = "prompt",
) -> int:
    """The request's max_tokens; unset means "fill the context" (sampling.resolve_max_tokens)."""
    try:
        return sampling.resolve_max_tokens(
            params.max_tokens, params.min_tokens, prompt_len, limits.max_model_len
        )
    except SamplingError as e:
        field = prompt_field if e.field == "prompt_token_ids" else f"{prefix}.{e.field}"
        raise InvalidArgument(e.problem, field=field) from None


def validate_prompt_token_ids(token_ids: Sequence[int], limits: Limits, field: str) -> None:
    """sampling.check_prompt (the length before any id is read, the ids by min/max in C), the
    error naming `field`, the request field the prompt came from."""
    try:
        check_prompt(token_ids, limits)
    except SamplingError as e:
        suffix = e.field.removeprefix("prompt_token_ids")  # "[i]"
        raise InvalidArgument(e.problem, field=field + suffix) from None


def validate_text(text: str, limits: Limits, field: str, allow_empty: bool = False) -> None:
    if not text and not allow_empty:
        raise InvalidArgument("must not be empty", field=field)
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limits.max_prompt_bytes:
        raise InvalidArgument(
            f"{size} bytes > max_prompt_bytes ({limits.max_prompt_bytes})", field=field
        )


def validate_messages(messages: Sequence[Any], limits: Limits) -> None:
    """Checks chat messages, (role, content) pairs or ChatMessage protos: at least one, at most
    max_chat_messages (counted before any is read), known roles, bounded total size."""
    if not messages:
        raise InvalidArgument("must hold at least one message", field="messages")
    if len(messages) > limits.max_chat_messages:
        raise InvalidArgument(
            f"at most {limits.max_chat_messages} messages, got {len(messages)}", field="messages"
        )
    total = 0
    for i, message in enumerate(messages):
        role, content = (message.role, message.content) if hasattr(message, "role") else message
        if len(role) > MAX_ROLE_LENGTH or role not in CHAT_ROLES:
            raise InvalidArgument(
                f"must be one of {sorted(CHAT_ROLES)}, got {echo(role)}",
                field=f"messages[{i}].role",
            )
        total += len(content.encode("utf-8", errors="surrogatepass"))
        if total > limits.max_prompt_bytes:
            raise InvalidArgument(
                f"contents total more than max_prompt_bytes ({limits.max_prompt_bytes})",
                field=f"messages[{i}].content",
            )


def validate_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(f"longer than {MAX_REQUEST_ID_LENGTH} characters", field="request_id")
    if not request_id.isprintable():
        raise InvalidArgument("must be printable", field="request_id")


def stream_interval_of(request: Any, default: int) -> int:
    """A Generate or Chat request's stream_interval, checked; `default` (the frontend's) unset."""
    if not request.HasField("stream_interval"):
        return default
    if not 1 <= request.stream_interval <= MAX_STREAM_INTERVAL:
        raise InvalidArgument(
            f"must be in [1, {MAX_STREAM_INTERVAL}], got {request.stream_interval}",
            field="stream_interval",
        )
    return int(request.stream_interval)
