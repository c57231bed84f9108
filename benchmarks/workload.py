"""The serving benchmark's requests: nano-vllm's workload (prompt and output lengths uniform in
[100, 1024], random token ids, ignore_eos) with optional Poisson arrival times. Plain lists, so
they travel to client processes as JSON.
"""

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float  # send time, seconds after the run's start


def lengths(
    num: int, lo: int, hi: int, out_lo: int, out_hi: int, seed: int = 0
) -> list[tuple[int, int]]:
    """(prompt length, output length) of each request, the same for every path measured."""
    rng = random.Random(seed)
    return [(rng.randint(lo, hi), rng.randint(out_lo, out_hi)) for _ in range(num)]


def step_lengths(tokens: int, rng: random.Random) -> list[int]:
    """Prompt lengths (uniform in [100, 1024]) filling one prefill step of `tokens` tokens."""
    lens: list[int] = []
    total = 0
    while total < tokens:
        lens.append(min(rng.randint(100, 1024), tokens - total))
        total += lens[-1]
    return lens


def arrivals(num: int, rate: float, seed: int = 0) -> list[float]:
    """Send times of a Poisson process of `rate` requests/s starting at 0 (all 0 when rate is
    infinite: every request at once)."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if rate == float("inf"):
        return [0.0] * num
    rng = random.Random(seed + 1)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def build(
    name: str, shape: list[tuple[int, int]], vocab: int, rate: float = float("inf"), seed: int = 0
) -> list[Request]:
    """Requests of the given (prompt, output) lengths with random ids drawn from `seed`: each path
    measured uses its own seed, so none of them finds another's prompts in the prefix cache."""
    rng = random.Random(f"{name}-{seed}")
    times = arrivals(len(shape), rate, seed)
    return [
        Request(f"{name}-{i}", [rng.randrange(vocab) for _ in range(p)], o, t)
        for i, ((p, o), t) in enumerate(zip(shape, times))
    ]
