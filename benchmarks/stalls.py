"""What can stall an engine step besides its own work, counted over a block of steps: Triton kernels
specialised (compiled, or loaded from the disk cache), Python GC pauses (both through the served
engine core's watch, worker.runner.serving_stalls) and the CUDA caching allocator's cudaMalloc
calls. `bench arrivals` reports them for each run."""

from types import TracebackType
from typing import Any

from nanoserve.worker.runner.serving_stalls import watch_stalls


class StallWatch:
    """A context manager: `summary()` after the block says what happened inside it."""

    def __init__(self, slow_gc_ms: float = 5.0) -> None:
        self.slow_gc_ms = slow_gc_ms
        self.compiled: list[str] = []
        self.gc_ms: list[float] = []
        self._uninstall = lambda: None
        self._segments = 0

    @staticmethod
    def _cuda_segments() -> int:  # cudaMalloc calls of the caching allocator so far (0 off CUDA)
        try:
            import torch
        except ImportError:
            return 0
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return 0
        return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))

    def __enter__(self) -> "StallWatch":
        def on_gc(ms: float, info: dict[str, Any]) -> None:
            self.gc_ms.append(ms)

        self._uninstall = watch_stalls(self.compiled.append, on_gc)
        self._segments = self._cuda_segments()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._segments = self._cuda_segments() - self._segments
        self._uninstall()

    def summary(self) -> dict:
        slow = [ms for ms in self.gc_ms if ms >= self.slow_gc_ms]
        return dict(
            triton_specialised=len(self.compiled),
            triton_kernels=sorted(set(self.compiled))[:5],
            gc_pauses=len(self.gc_ms),
            gc_max_ms=round(max(self.gc_ms, default=0.0), 2),
            gc_slow=len(slow),
            cuda_mallocs=self._segments,
        )
