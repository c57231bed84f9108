"""The ranges of the sampling fields (vLLM's rules): one table that the frontend checks on the proto
(frontend/validation.py) and the worker's SamplingParams checks again (worker/sampling_params.py),
and the bounds of logit_bias and allowed_token_ids, which LLMEngine.validate also checks by vocabulary.
"""

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

MAX_N = 16  # completions per request (SamplingParams.n): each takes one of the engine's batch slots

MAX_LOGPROBS = 20  # top alternatives per position (OpenAI's top_logprobs bound; vLLM's default)
RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "temperature": (lambda v: v >= 0, ">= 0"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: v >= -1, "-1 or 0 (disabled) or positive"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "max_tokens": (lambda v: v >= 1, ">= 1"),
    "min_tokens": (lambda v: v >= 0, ">= 0"),
    "repetition_penalty": (lambda v: v > 0, "> 0"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "n": (lambda v: 1 <= v <= MAX_N, f"in [1, {MAX_N}]"),
    "logprobs": (lambda v: 0 <= v <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]"),
    "prompt_logprobs": (lambda v: 0 <= v <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]"),
}
FLOAT_FIELDS = frozenset(
    {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
)


def violations(values: Mapping[str, float]) -> Iterator[tuple[str, str]]:
    """(field, rule it breaks) for each given field out of range, in RULES order; fields that are
    not given (unset) are not checked."""
    for name, (ok, rule) in RULES.items():
        if name not in values:
            continue
        value = values[name]
        if name in FLOAT_FIELDS and not math.isfinite(value):
            yield name, "a finite number"
        elif not ok(value):
            yield name, rule
    if (
        "min_tokens" in values
        and "max_tokens" in values
        and values["min_tokens"] > values["max_tokens"]
    ):
        yield "min_tokens", f"<= max_tokens ({values['max_tokens']})"


# logit_bias (OpenAI) and allowed_token_ids (vLLM): bounded by their length before any entry is
# read; the worker's byte bound of an unparsed request (worker.validation) leaves room for both
MAX_LOGIT_BIAS = 1024  # entries (token id -> bias) per request
MAX_BIAS = 100.0  # |bias| (OpenAI's range); -100 in effect bans a token, +100 forces it
MAX_ALLOWED_TOKEN_IDS = 65_536  # ids per request (a 5-byte varint each on the wire)


def logit_bias_violation(
    bias: Mapping[int, float], vocab_size: int | None = None
) -> tuple[str, str] | None:
    """(field suffix, rule it breaks) when `bias` (token id -> bias) is refused, else None; ids
    are checked against `vocab_size` when it is given. At most MAX_LOGIT_BIAS entries are read."""
    if len(bias) > MAX_LOGIT_BIAS:
        return "", f"at most {MAX_LOGIT_BIAS} entries, got {len(bias)}"
    for token_id, value in bias.items():
        if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
            return "", _outside(token_id, vocab_size)
        if not -MAX_BIAS <= value <= MAX_BIAS:  # NaN fails the comparison too
            return "", (
                f"the bias of token {token_id} must be a finite number in "
                f"[{-MAX_BIAS:g}, {MAX_BIAS:g}], got {value!r}"
            )
    return None


def allowed_token_ids_violation(
    token_ids: Sequence[int], vocab_size: int | None = None
) -> tuple[str, str] | None:
    """(field suffix, rule it breaks) when `token_ids` are refused, else None: 1 to
    MAX_ALLOWED_TOKEN_IDS ids (counted before any is read), each in [0, vocab_size)."""
    if not token_ids:
        return "", "must not be empty (leave it unset to allow every token)"
    if len(token_ids) > MAX_ALLOWED_TOKEN_IDS:
        return "", f"at most {MAX_ALLOWED_TOKEN_IDS} ids, got {len(token_ids)}"
    # min / max walk the ids in C; the Python loop only runs to name a bad one
    too_big = vocab_size is not None and max(token_ids) >= vocab_size
    if min(token_ids) < 0 or too_big:
        for i, token_id in enumerate(token_ids):
            if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                return f"[{i}]", _outside(token_id, vocab_size)
    return None


def only_ending_ids_violation(
    allowed_token_ids: Sequence[int],
    stop_token_ids: Iterable[int],
    eos_token_ids: Iterable[int],
    ignore_eos: bool,
    min_tokens: int,
) -> str | None:
    """The rule broken when min_tokens must ban every allowed id (each an eos or a stop id): the
    row would have nothing to sample. None when an allowed id is left, or min_tokens is 0."""
    if min_tokens <= 0 or not allowed_token_ids:
        return None
    ends = set(stop_token_ids)
    if not ignore_eos:
        ends.update(eos_token_ids)
    if not ends.issuperset(allowed_token_ids):
        return None
    return (
        "every allowed id ends the output (an eos or stop token id), so "
        f"min_tokens {min_tokens} could not be met"
    )


def _outside(token_id: int, vocab_size: int | None) -> str:
    if vocab_size is None:
        return f"token id {token_id} must be >= 0"
    return f"token id {token_id} is outside the vocabulary [0, {vocab_size})"
