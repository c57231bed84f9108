"""One CUDA graph of a step's forward, as the decode (runner.cuda_graph) and prefill
(runner.prefill_graph) graph runners capture them at start-up: an eager warm-up (compiles or loads
the kernels, sizes cuBLAS workspaces), then the capture, each timed for the start-up log."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.cuda import _POOL_HANDLE  # what CUDAGraph.pool() returns

# torch.cuda.graph empties the caching allocator (and the pinned host cache) before every capture:
# the blocks the warm-up forward just took go back to the driver and the next warm-up takes them
# again. The graphs' private pools need no such room (the KV cache's sizing left the warm-up's
# peak and 2 GiB for them), so capture_graph begins the capture itself. It saves little: on the
# H100 (dd35a75) 36 decode captures took 0.82 s against 0.91 with torch's way (True, `bench
# variants emptycache`).
EMPTY_CACHE_PER_CAPTURE = False
_capture_stream: torch.cuda.Stream | None = None  # a side stream, as torch.cuda.graph's default


@dataclass
class CaptureTimes:
    """Seconds the graphs of one runner took to warm up and to capture (each up to the GPU's end)."""

    graphs: int = 0
    warmup_s: float = 0.0
    capture_s: float = 0.0
    # each graph's warm-up, in capture order (largest first): first-use costs land in the first
    each_warmup_ms: list[float] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.graphs} graphs (warm-up {self.warmup_s:.2f} s, capture {self.capture_s:.2f} s)"
        )


def capture_graph(
    forward: Callable[[], None],
    pool: _POOL_HANDLE | None,
    times: CaptureTimes,
    warmup: Callable[[], None] | None = None,
) -> torch.cuda.CUDAGraph:
    """forward run eagerly once (or `warmup`, where the rest of forward has run at these shapes
    already), then captured into a graph over the memory pool `pool` (None: a new one, the
    graph's own)."""
    t0 = time.perf_counter()
    (warmup or forward)()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    if EMPTY_CACHE_PER_CAPTURE:
        with torch.cuda.graph(graph, pool):
            forward()
    else:
        global _capture_stream
        if _capture_stream is None:
            _capture_stream = torch.cuda.Stream()
        with torch.cuda.stream(_capture_stream):  # (capture needs a stream other than the legacy)
            graph.capture_begin(pool=pool)
            try:
                forward()
            finally:
                graph.capture_end()
    torch.cuda.synchronize()
    times.graphs += 1
    times.warmup_s += t1 - t0
    times.each_warmup_ms.append(round((t1 - t0) * 1e3, 1))
    times.capture_s += time.perf_counter() - t1
    return graph
