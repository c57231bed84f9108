"""Times the parts of a ModelRunner's start (device, model, weights, KV cache, graphs, kernels),
so that a slow engine start says where its seconds went: one log line, and `phases` for the
benchmarks (benchmarks.prefill prints them)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class StartClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()
        self.phases: dict[str, float] = {}  # name -> seconds, in the order they ran

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the block; on CUDA up to the end of the GPU work it queued (a weight copy or a
        capture would otherwise count in the next phase)."""
        t = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.phases[name] = round(time.perf_counter() - t, 3)

    def summary(self) -> str:
        """`3.1 s: device 0.4, model 0.1, ...`; the rest (config, small tensors) is `other`."""
        total = time.perf_counter() - self.started
        parts = [f"{name} {s:.2f}" for name, s in self.phases.items()]
        parts.append(f"other {max(0.0, total - sum(self.phases.values())):.2f}")
        return f"{total:.1f} s: " + ", ".join(parts)
