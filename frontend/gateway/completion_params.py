"""The legacy completions' own parameters, called by params.map_completion: echo and best_of set
gRPC sampling fields and return what echo.py (on the call's chunks) and best_of.py (on the whole
reply) do with the output; suffix is refused.
"""

from dataclasses import dataclass
from typing import Any

from nanoserve.frontend.gateway.errors import bad_param
from nanoserve.frontend.gateway.protocol import CompletionRequest
from nanoserve.sampling import MAX_N


@dataclass(frozen=True, slots=True)
class Echo:
    """echo: true. `prompt` as the request gave it (text or token ids); `logprobs`: the client's k,
    the prompt's tokens then lead choices[].logprobs; `prompt_logprobs`: the client's own (vLLM's
    field), None when the call asked for prompt entries only for echo's sake; `no_tokens`:
    max_tokens 0, the one token the call generates is dropped."""

    prompt: str | list[int]
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    no_tokens: bool = False


@dataclass(frozen=True, slots=True)
class BestOf:
    """best_of > n: the call samples `best_of` completions, the reply keeps the `n` best;
    `strip_logprobs`: the client did not ask for logprobs (the call did, to rank them)."""

    best_of: int
    n: int
    strip_logprobs: bool


def map_completion_extras(
    request: CompletionRequest,
    prompt: str | list[int],
    sampling: dict[str, Any],
    param_names: dict[str, str],
) -> tuple[Echo | None, BestOf | None]:
    """echo and best_of onto `sampling` (the gRPC fields, already mapped from the request)."""
    if request.suffix not in (None, ""):
        raise bad_param(
            "suffix",
            "is not supported: the served model (Qwen3) has no fill-in-the-middle tokens to "
            "put a suffix after the completion",
        )
    return _map_echo(request, prompt, sampling, param_names), _map_best_of(
        request, sampling, param_names
    )


def _map_echo(
    request: CompletionRequest,
    prompt: str | list[int],
    sampling: dict[str, Any],
    param_names: dict[str, str],
) -> Echo | None:
    if not request.echo:
        return None
    no_tokens = request.max_tokens == 0
    if no_tokens:
        if request.min_tokens:
            raise bad_param("min_tokens", "must be 0 with max_tokens 0")
        # The gRPC API generates at least one token (max_tokens >= 1); the prefill that scores the
        # prompt samples it anyway, so asking for it costs nothing, and echo.py drops it (vLLM
        # does the same).
        sampling["max_tokens"] = 1
    k, p = request.logprobs, request.prompt_logprobs
    # The prompt's entries, for the reply's logprobs (k); a token-id prompt's text comes from
    # Detokenize (echo.py), so without logprobs the call keeps its prefix-cache hits.
    wanted = [v for v in (k, p) if v is not None]
    if wanted and (p is None or 0 <= p < max(wanted)):  # a bad p is left for the frontend to name
        sampling["prompt_logprobs"] = max(wanted)
        param_names["sampling_params.prompt_logprobs"] = "logprobs" if k is not None else "echo"
    return Echo(prompt, k, p, no_tokens)


def _map_best_of(
    request: CompletionRequest, sampling: dict[str, Any], param_names: dict[str, str]
) -> BestOf | None:
    best_of = request.best_of
    n = request.n if request.n is not None else 1
    if best_of is None or not 1 <= n <= MAX_N:  # a bad n is left for the frontend to name
        return None
    if best_of < n:
        raise bad_param("best_of", f"must be >= n ({n}), got {best_of}")
    if best_of > MAX_N:
        raise bad_param("best_of", f"must be <= {MAX_N}, got {best_of}")
    if best_of == n:
        return None
    if request.stream:
        raise bad_param(
            "best_of", "> n cannot be streamed: the best completions are known once all ended"
        )
    sampling["n"] = best_of
    param_names["sampling_params.n"] = "best_of"
    strip = request.logprobs is None
    if strip:  # each sampled token's logprob ranks the completions (best_of.py)
        sampling["logprobs"] = 0
        param_names["sampling_params.logprobs"] = "best_of"
    return BestOf(best_of, n, strip)
