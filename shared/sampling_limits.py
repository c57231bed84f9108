"""The limits a request's sampling params are checked against, and the rules on the token ids it
carries (prompt, stop, logit_bias, allowed_token_ids): each list counted before it is read, each id
in the vocabulary. nanoserve.sampling's SamplingParams and the services' doors use them.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_LOGIT_BIAS = 1024  # entries (token id -> bias) per request
MAX_BIAS = 100.0  # |bias| (OpenAI's range); -100 in effect bans a token, +100 forces it
MAX_ALLOWED_TOKEN_IDS = 65_536  # ids per request (a 5-byte varint each on the wire)
DEFAULT_MAX_STOP_TOKEN_IDS = 128


class SamplingError(ValueError):
    """A request that breaks a rule: `field` is the SamplingParams field (with `[i]` or `.kind`
    where it is an element), `problem` what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request is checked against: the engine's (GetModelInfo reports them) and the stop
    string bounds of the frontend, the only side that reads stop strings."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    max_num_seqs: int | None = None
    max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS
    max_stop_strings: int = 16
    max_stop_string_length: int = 256


def resolve_max_tokens(
    max_tokens: int | None, min_tokens: int, prompt_len: int, max_model_len: int
) -> int:
    """max_tokens of a prompt of `prompt_len` tokens, unset (None) filling the context: the prompt
    plus max_tokens must fit in max_model_len, min_tokens must not pass the result."""
    room = max_model_len - prompt_len
    if room < 1:
        raise SamplingError(
            "prompt_token_ids",
            f"the prompt has {prompt_len} tokens; max_model_len is {max_model_len} "
            "(room for 1 new token needed)",
        )
    resolved = room if max_tokens is None else max_tokens
    if resolved > room:
        raise SamplingError(
            "max_tokens",
            f"prompt ({prompt_len} tokens) + max_tokens ({resolved}) > max_model_len ({max_model_len})",
        )
    if min_tokens > resolved:
        raise SamplingError("min_tokens", f"must be <= max_tokens ({resolved}), got {min_tokens}")
    return resolved


def check_prompt(token_ids: Sequence[int], limits: Limits) -> None:
    """A prompt of token ids: not empty, room for one new token (counted before an id is read),
    each id in the vocabulary; SamplingError("prompt_token_ids...")."""
    if not token_ids:
        raise SamplingError("prompt_token_ids", "must not be empty")
    if len(token_ids) >= limits.max_model_len:
        raise SamplingError(
            "prompt_token_ids",
            f"the prompt has {len(token_ids)} tokens; max_model_len is {limits.max_model_len} "
            "(room for 1 new token needed)",
        )
    check_token_ids(token_ids, limits.vocab_size, "prompt_token_ids")


def bounded_tuple(values: Iterable[Any], name: str, bound: int, noun: str = "ids") -> tuple:
    """`values` as a tuple, counted before it is walked."""
    if hasattr(values, "__len__") and len(values) > bound:  # type: ignore[arg-type]
        raise SamplingError(name, f"at most {bound} {noun}, got {len(values)}")  # type: ignore[arg-type]
    return tuple(values)


def bias_dict(bias: Mapping[int, float] | Iterable[Sequence[float]]) -> dict[int, float] | None:
    """{token id: bias} from a mapping or [id, bias] pairs (a msgpack frame's); None when empty."""
    if len(bias) > MAX_LOGIT_BIAS:  # type: ignore[arg-type]
        raise SamplingError("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")  # type: ignore[arg-type]
    pairs = bias.items() if isinstance(bias, Mapping) else bias
    try:
        return {int(token_id): float(value) for token_id, value in pairs} or None
    except (TypeError, ValueError):
        raise SamplingError("logit_bias", "must map token ids to numbers") from None


def check_logit_bias(bias: Mapping[int, float], vocab_size: int | None) -> None:
    for token_id, value in bias.items():
        if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
            raise SamplingError("logit_bias", outside(token_id, vocab_size))
        if not -MAX_BIAS <= value <= MAX_BIAS:  # NaN fails the comparison too
            raise SamplingError(
                "logit_bias",
                f"the bias of token {token_id} must be a finite number in "
                f"[{-MAX_BIAS:g}, {MAX_BIAS:g}], got {value!r}",
            )


def check_token_ids(
    token_ids: Sequence[int],
    vocab_size: int | None,
    name: str = "allowed_token_ids",
    allow_empty: bool = False,
) -> None:
    if not token_ids:
        if allow_empty:
            return
        raise SamplingError(name, "must not be empty (leave it unset to allow every token)")
    # min / max walk the ids in C; the Python loop only runs to name a bad one
    if min(token_ids) < 0 or (vocab_size is not None and max(token_ids) >= vocab_size):
        for i, token_id in enumerate(token_ids):
            if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                raise SamplingError(f"{name}[{i}]", outside(token_id, vocab_size))


def outside(token_id: int, vocab_size: int | None) -> str:
    if vocab_size is None:
        return f"token id {token_id} must be >= 0"
    return f"token id {token_id} is outside the vocabulary [0, {vocab_size})"
