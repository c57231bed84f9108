"""Per-request sampling and stopping parameters (vLLM names), as the engine consumes them.

The gRPC worker builds one from the proto's SamplingParams; offline users pass it to LLM.generate.
A field a model's generation_config.json may set is None when not given: it reads as vLLM's
default and is listed in `unset`, and LLMEngine.add_request fills it from the model's defaults
(with_defaults).
"""

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from nanoserve.sampling_rules import (
    MAX_LOGIT_BIAS,
    RULES,
    allowed_token_ids_violation,
    logit_bias_violation,
    violations,
)
from nanoserve.structured_output import check as check_structured_output

LOGPROBS_MODES = ("raw", "processed")
# vLLM's defaults of the fields that a model's generation_config.json may override
FALLBACKS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float | None = None  # 0 = greedy; None: the model's default, else 1.0
    top_p: float | None = None  # None: the model's default, else 1.0
    top_k: int | None = None  # -1 or 0 = disabled; None: the model's default, else -1
    min_p: float | None = None  # None: the model's default, else 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None = until the context is full
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float | None = None  # None: the model's default, else 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1  # completions of the prompt, sharing its KV blocks (1..MAX_N)
    logprobs: int | None = None  # top alternatives per output token; None: no logprobs
    prompt_logprobs: int | None = None  # the same for the prompt tokens
    logprobs_mode: str = "raw"  # "raw" (log_softmax of the logits) or "processed" (as sampled)
    # (kind, text): the output must match a JSON Schema, a regex, an EBNF grammar, an xgrammar
    # structural tag or be any JSON object (kinds: nanoserve.structured_output.KINDS; text "" for
    # json_object); None: free text
    structured_output: tuple[str, str] | None = None
    # OpenAI's logit_bias: token id -> bias in [-100, 100], added to the logits before sampling (a
    # dict once built; [id, bias] pairs on the far side of a msgpack frame); None or {}: no bias
    logit_bias: Mapping[int, float] | None = None
    # vLLM's allowed_token_ids: only these ids may be sampled (a tuple once built, not empty);
    # None: every token
    allowed_token_ids: Sequence[int] | None = None
    # the fields of FALLBACKS that were not given (they hold the fallback value)
    unset: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    # logit_bias or allowed_token_ids is set (worker.engine.token_rules applies them): a plain
    # field, as the sampler's inputs read it for every row of every step
    has_token_rules: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self):
        given = {name: getattr(self, name) for name in RULES if getattr(self, name) is not None}
        for name, rule in violations(given):
            raise ValueError(f"{name} must be {rule}, got {given[name]!r}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.structured_output is not None:
            kind, spec = self.structured_output  # a list after a msgpack frame
            problem = check_structured_output(kind, spec)
            if problem is not None:
                raise ValueError(f"{problem[0]}: {problem[1]}")
            object.__setattr__(self, "structured_output", (kind, spec))
        self._normalize_token_rules()
        unset = frozenset(name for name in FALLBACKS if getattr(self, name) is None)
        for name in unset:
            object.__setattr__(self, name, FALLBACKS[name])
        object.__setattr__(self, "unset", unset)

    def _normalize_token_rules(self) -> None:
        """logit_bias as a dict of int -> float (None when empty) and allowed_token_ids as a
        tuple, each counted before it is read; ValueError naming the field."""
        bias = self.logit_bias
        if bias is not None:
            if len(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
            pairs = bias.items() if isinstance(bias, Mapping) else bias
            try:
                bias = {int(token_id): float(value) for token_id, value in pairs}
            except (TypeError, ValueError):
                raise ValueError("logit_bias: must map token ids to numbers") from None
            problem = logit_bias_violation(bias)
            if problem is not None:
                raise ValueError(f"logit_bias{problem[0]}: {problem[1]}")
            object.__setattr__(self, "logit_bias", bias or None)
        if self.allowed_token_ids is not None:
            problem = allowed_token_ids_violation(self.allowed_token_ids)
            if problem is not None:
                raise ValueError(f"allowed_token_ids{problem[0]}: {problem[1]}")
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        rules = self.logit_bias is not None or self.allowed_token_ids is not None
        object.__setattr__(self, "has_token_rules", rules)

    def as_fields(self) -> dict:
        """The init fields as plain values (unset ones as None): `SamplingParams(**d)` rebuilds
        these params on the far side of a msgpack frame (the engine-core process)."""
        out = {
            f.name: None if f.name in self.unset else getattr(self, f.name)
            for f in fields(self)
            if f.init
        }
        out["stop_token_ids"] = list(self.stop_token_ids)
        if self.structured_output is not None:
            out["structured_output"] = list(self.structured_output)
        if self.logit_bias is not None:  # msgpack maps take str keys only: [id, bias] pairs
            out["logit_bias"] = [[t, b] for t, b in self.logit_bias.items()]
        if self.allowed_token_ids is not None:
            out["allowed_token_ids"] = list(self.allowed_token_ids)
        return out

    def with_defaults(self, defaults: Mapping[str, float]) -> "SamplingParams":
        """These params with their unset fields taken from `defaults` (a model's
        generation_config.json sampling fields: ModelConfig.sampling_defaults)."""
        changes: dict[str, Any] = {name: defaults[name] for name in self.unset if name in defaults}
        return replace(self, **changes) if changes else self

    def for_completion(self, index: int) -> "SamplingParams":
        """The params of completion `index` of n: a seeded request's completions draw from
        distinct seed streams, derived from the seed (index 0 keeps it: n = 1 is unchanged)."""
        if self.seed is None or index == 0:
            return self
        digest = hashlib.blake2b(f"{self.seed}/{index}".encode(), digest_size=8).digest()
        return replace(
            self, seed=int.from_bytes(digest, "little") >> 1
        )  # in [0, 2**63), like any int64 seed (worker.seeded_noise)

    @property
    def knobs(self) -> tuple[float, int, float, float]:
        """(temperature, top_k, top_p, min_p): never None, __post_init__ filled the unset ones."""
        temperature, top_k, top_p, min_p = self.temperature, self.top_k, self.top_p, self.min_p
        assert temperature is not None and top_k is not None
        assert top_p is not None and min_p is not None
        return temperature, top_k, top_p, min_p

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
