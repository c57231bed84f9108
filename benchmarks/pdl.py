"""What programmatic dependent launch saves a kernel boundary inside a CUDA graph (H100/H200):
chains of small Triton kernels, alone and after cuBLAS GEMMs, launched plainly or with PDL; and
what a graph's launch costs the host by its kernel count, with and without PDL
(`python -m nanoserve.benchmarks.pdl`; prints one JSON line per chain)."""

import json
import statistics
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    # one row of a (rows, BLOCK) activation a program, as the engine's norm kernels
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        if EARLY:  # the next kernel may launch now: its programs wait in gdc_wait for this one
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the previous kernel's writes are visible past this point
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * 1.0001 + 0.5, mask=offs < n)


def _scale(x: torch.Tensor, y: torch.Tensor, pdl: bool, early: bool) -> None:
    rows, width = x.shape
    kw = dict(launch_pdl=True) if pdl else {}
    _scale_kernel[(rows,)](x, y, x.numel(), BLOCK=width, PDL=pdl, EARLY=early, **kw)


def chain_us(rows: int, width: int, links: int, gemm: bool, pdl: bool, early: bool) -> float:
    """µs a link of a graph-captured chain: `links` scale kernels (each after a (rows, width) x
    (width, width) cuBLAS GEMM when `gemm`)."""
    a = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    w = torch.randn(width, width, device="cuda", dtype=torch.bfloat16) / width**0.5

    def body() -> None:
        for _ in range(links):
            if gemm:
                torch.mm(a, w, out=b)
                _scale(b, a, pdl, early)
            else:
                _scale(a, b, pdl, early)
                _scale(b, a, pdl, early)

    body()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 50
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / reps / links


def launch_us(kernels: int, pdl: bool) -> float:
    """Host µs of one replay of a graph of `kernels` small Triton kernels (with or without the
    PDL attribute), the GPU held busy so the host never waits: what a graph's launch costs the
    host as its node count grows (a batch-1 decode graph holds ~260)."""
    a = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)

    def body() -> None:
        for _ in range(kernels // 2):
            _scale(a, b, pdl, False)
            _scale(b, a, pdl, False)

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU cycles ahead of each replay
        t0 = time.perf_counter()
        graph.replay()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    for kernels in (2, 64, 256, 512):
        launch: dict[str, object] = dict(bench="graph_launch", kernels=kernels)
        for name, pdl in (("plain", False), ("pdl", True)):
            launch[f"{name}_host_us"] = round(launch_us(kernels, pdl), 1)
        print(json.dumps(launch), flush=True)
    for gemm in (False, True):
        for rows, width in ((16, 1024), (128, 1024), (256, 4096)):
            row: dict[str, object] = dict(
                bench="pdl", after="cublas_gemm" if gemm else "triton", rows=rows, width=width
            )
            for name, pdl, early in (
                ("plain", False, False),
                ("pdl", True, False),
                ("pdl_early", True, True),
            ):
                row[f"{name}_us"] = round(chain_us(rows, width, 50, gemm, pdl, early), 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
