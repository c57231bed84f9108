"""Checks every field of a public request before anything reaches the worker.

Each check raises shared.errors.InvalidArgument naming the offending field (status
INVALID_ARGUMENT); the servicer calls these before admission and tokenization costs anything.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.client_requests import MAX_STREAM_INTERVAL
from nanoserve.errors import InvalidArgument, echo
from nanoserve.proto.v1 import common_pb2
from nanoserve.sampling_rules import (
    RULES,
    allowed_token_ids_violation,
    logit_bias_violation,
    only_ending_ids_violation,
    violations,
)
from nanoserve.structured_output import check as check_structured_output
from nanoserve.structured_output import from_proto as structured_output_from_proto

INT64_MAX = 2**63 - 1
LOGPROBS_MODES = frozenset(common_pb2.LogprobsMode.values())
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_REQUEST_ID_LENGTH = 128
MAX_ROLE_LENGTH = 32  # longer than any of CHAT_ROLES: refused before the role is compared or echoed
# Defaults of the FrontendConfig fields of the same names (a hostile list is refused by its length,
# before a single element is read).
DEFAULT_MAX_STOP_TOKEN_IDS = 128
DEFAULT_MAX_CHAT_MESSAGES = 4096


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits requests are checked against: the frontend's own and those the worker reported."""

    max_model_len: int
    vocab_size: int
    max_stop_strings: int
    max_stop_string_length: int
    max_prompt_bytes: int
    max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS
    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES
    eos_token_ids: tuple[int, ...] = ()  # the model's, as the worker reported them


def validate_sampling_params(
    params: common_pb2.SamplingParams, limits: Limits, prefix: str = "sampling_params"
) -> None:
    """Checks ranges that do not depend on the prompt; see resolve_max_tokens for the rest."""

    given = {name: getattr(params, name) for name in RULES if params.HasField(name)}
    for name, rule in violations(given):
        raise InvalidArgument(f"must be {rule}, got {given[name]}", field=f"{prefix}.{name}")
    if params.HasField("logprobs_mode") and params.logprobs_mode not in LOGPROBS_MODES:
        raise InvalidArgument(
            f"unknown value {params.logprobs_mode}", field=f"{prefix}.logprobs_mode"
        )
    # structured output: bounded and well-formed here; compiled by the worker (its grammar engine
    # needs torch), which answers INVALID_ARGUMENT naming the field for one that does not compile
    constraint = structured_output_from_proto(params.structured_output)
    if constraint is not None:
        problem = check_structured_output(*constraint)
        if problem is not None:
            raise InvalidArgument(problem[1], field=problem[0])
    if len(params.stop) > limits.max_stop_strings:
        raise InvalidArgument(
            f"at most {limits.max_stop_strings} stop strings, got {len(params.stop)}",
            field=f"{prefix}.stop",
        )
    for i, stop in enumerate(params.stop):
        if not stop:
            raise InvalidArgument("must not be empty", field=f"{prefix}.stop[{i}]")
        if len(stop) > limits.max_stop_string_length:
            raise InvalidArgument(
                f"longer than {limits.max_stop_string_length} characters",
                field=f"{prefix}.stop[{i}]",
            )
    if len(params.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidArgument(
            f"at most {limits.max_stop_token_ids} stop token ids, got {len(params.stop_token_ids)}",
            field=f"{prefix}.stop_token_ids",
        )
    for i, token_id in enumerate(params.stop_token_ids):
        if token_id >= limits.vocab_size:
            raise InvalidArgument(
                f"token id {token_id} >= vocab_size {limits.vocab_size}",
                field=f"{prefix}.stop_token_ids[{i}]",
            )
    # empty is unset (proto3); each is counted before an entry is read
    if params.logit_bias:
        problem = logit_bias_violation(params.logit_bias, limits.vocab_size)
        if problem is not None:
            raise InvalidArgument(problem[1], field=f"{prefix}.logit_bias{problem[0]}")
    if params.allowed_token_ids:
        problem = allowed_token_ids_violation(params.allowed_token_ids, limits.vocab_size)
        if problem is not None:
            raise InvalidArgument(problem[1], field=f"{prefix}.allowed_token_ids{problem[0]}")
        ending = only_ending_ids_violation(
            params.allowed_token_ids,
            params.stop_token_ids,
            limits.eos_token_ids,
            params.ignore_eos,
            params.min_tokens,
        )
        if ending is not None:
            raise InvalidArgument(ending, field=f"{prefix}.allowed_token_ids")


def resolve_max_tokens(
    params: common_pb2.SamplingParams,
    prompt_len: int,
    limits: Limits,
    prefix: str = "sampling_params",
    prompt_field: str = "prompt",
) -> int:
    """The request's max_tokens; unset means "fill the context". The prompt plus max_tokens must
    fit in max_model_len, and min_tokens must not exceed the result."""
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise InvalidArgument(
            f"{prompt_len} tokens leave no room in max_model_len {limits.max_model_len}",
            field=prompt_field,
        )
    max_tokens = params.max_tokens if params.HasField("max_tokens") else room
    if max_tokens > room:
        raise InvalidArgument(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) > "
            f"max_model_len ({limits.max_model_len})",
            field=f"{prefix}.max_tokens",
        )
    if params.HasField("min_tokens") and params.min_tokens > max_tokens:
        raise InvalidArgument(
            f"must be <= max_tokens ({max_tokens}), got {params.min_tokens}",
            field=f"{prefix}.min_tokens",
        )
    return max_tokens


def validate_prompt_token_ids(token_ids: Sequence[int], limits: Limits, field: str) -> None:
    """Checks the length before reading an id: a 15M-id list costs one len() (the proto's repeated
    field answers it without a walk), not a 15M-step loop."""
    if not token_ids:
        raise InvalidArgument("must not be empty", field=field)
    if len(token_ids) >= limits.max_model_len:
        raise InvalidArgument(
            f"{len(token_ids)} tokens leave no room in max_model_len {limits.max_model_len}",
            field=field,
        )
    for i, token_id in enumerate(token_ids):
        if token_id >= limits.vocab_size:
            raise InvalidArgument(
                f"token id {token_id} >= vocab_size {limits.vocab_size}", field=f"{field}[{i}]"
            )


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


def worker_sampling_params(
    params: common_pb2.SamplingParams, max_tokens: int
) -> common_pb2.SamplingParams:
    """The worker's copy: max_tokens resolved, frontend-only fields left out."""
    forwarded = common_pb2.SamplingParams()
    forwarded.CopyFrom(params)
    forwarded.max_tokens = max_tokens
    del forwarded.stop[:]
    for name in ("include_stop_str_in_output", "skip_special_tokens"):
        forwarded.ClearField(name)
    return forwarded
