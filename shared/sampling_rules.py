"""The ranges of the sampling fields (vLLM's rules): one table that the frontend checks on the proto
(frontend/validation.py) and the worker's SamplingParams checks again (worker/sampling_params.py).
"""

import math
from collections.abc import Callable, Iterator, Mapping

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
