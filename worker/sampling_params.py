"""Per-request sampling and stopping parameters (vLLM names), as the engine consumes them.

The gRPC worker builds one from the proto's SamplingParams; offline users pass it to LLM.generate.
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None = until the context is full
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        def bad(name: str, rule: str):
            raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                bad(name, "a finite number")
        if self.temperature < 0:
            bad("temperature", ">= 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", "in (0, 1]")
        if self.top_k < -1:
            bad("top_k", "-1, 0 (disabled) or positive")
        if not 0 <= self.min_p <= 1:
            bad("min_p", "in [0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", ">= 1")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad("min_tokens", ">= 0 and <= max_tokens")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", "> 0")
        if not -2 <= self.presence_penalty <= 2:
            bad("presence_penalty", "in [-2, 2]")
        if not -2 <= self.frequency_penalty <= 2:
            bad("frequency_penalty", "in [-2, 2]")
        if any(t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "non-negative")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
