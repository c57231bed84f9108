"""Times the parts of a ModelRunner's start (device, model, weights, KV cache, graphs, kernels),
so that a slow engine start says where its seconds went: one log line, and `phases` for the
benchmarks (benchmarks.prefill prints them), with the Triton kernels each phase specialised and
the garbage collector's share of it."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from nanoserve.worker.runner.serving_stalls import watch_stalls


class StartClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()
        self.phases: dict[str, float] = {}  # name -> seconds, in the order they ran
        self.kernels: dict[str, int] = {}  # name -> Triton specialisations (compiled or loaded)
        self.gc_s: dict[str, float] = {}  # name -> seconds the garbage collector held it

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the block; on CUDA up to the end of the GPU work it queued (a weight copy or a
        capture would otherwise count in the next phase)."""
        kernels, gc_ms = 0, 0.0

        def on_specialise(kernel: str) -> None:
            nonlocal kernels
            kernels += 1

        def on_gc(ms: float, info: dict) -> None:
            nonlocal gc_ms
            gc_ms += ms

        unwatch = watch_stalls(on_specialise, on_gc)
        t = time.perf_counter()
        try:
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            unwatch()
        self.phases[name] = round(time.perf_counter() - t, 3)
        self.kernels[name], self.gc_s[name] = kernels, round(gc_ms / 1e3, 3)

    def summary(self) -> str:
        """`3.1 s: device 0.4, model 0.1, ..., graphs 1.2 (40 kernels, gc 0.3)`; the rest (config,
        small tensors) is `other`."""
        total = time.perf_counter() - self.started
        parts = []
        for name, s in self.phases.items():
            extra = [f"{n} kernels" for n in [self.kernels.get(name, 0)] if n]
            extra += [f"gc {g:.2f}" for g in [self.gc_s.get(name, 0.0)] if g >= 0.005]
            parts.append(f"{name} {s:.2f}" + (f" ({', '.join(extra)})" if extra else ""))
        parts.append(f"other {max(0.0, total - sum(self.phases.values())):.2f}")
        return f"{total:.1f} s: " + ", ".join(parts)
