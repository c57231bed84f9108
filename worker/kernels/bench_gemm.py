"""`python -m worker.kernels.bench_gemm`: small-M linear layers on the GPU machine, cuBLAS (F.linear)
against worker.kernels.skinny_gemm at its chosen tiles and at every tile of a sweep.

Times come from a CUDA graph of REPS back-to-back calls (a decode step replays such a graph, and
launch overhead would otherwise hide microsecond kernels); GB/s counts the weight bytes read.
"""
import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from worker.kernels.skinny_gemm import skinny_gemm, skinny_gemm_config

REPS = 20
SHAPES = {  # (N, K) of qkv, o, gate_up, down per rank
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "qwen3-8b-tp2": [(3072, 4096), (4096, 2048), (12288, 4096), (4096, 6144)],
}


def graph_us(fn) -> float:
    """µs per call of fn() replayed from a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * REPS)


def sweep_configs(m: int):
    bm = 1 << (m - 1).bit_length()
    for bn, bk, warps in itertools.product((2, 4, 8, 16), (128, 256, 512), (2, 4, 8)):
        if bm * bn * bk <= 32768:
            yield dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=3)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m worker.kernels.bench_gemm", description=__doc__)
    p.add_argument("--shapes", nargs="*", default=sorted(SHAPES), choices=sorted(SHAPES))
    p.add_argument("--m", type=int, nargs="*", default=[1, 2, 4, 8])
    p.add_argument("--sweep", action="store_true", help="also time every tile of the sweep")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    for shape in args.shapes:
        for (n, k), m in itertools.product(SHAPES[shape], args.m):
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            err = (skinny_gemm(x, w).float() - F.linear(x, w).float()).abs().max().item()
            cublas = graph_us(lambda: F.linear(x, w))
            ours = graph_us(lambda: skinny_gemm(x, w))
            row = dict(bench="gemm", shape=shape, m=m, n=n, k=k, cublas_us=round(cublas, 2),
                       skinny_us=round(ours, 2), skinny_gb_s=round(n * k * 2 / ours / 1e3),
                       max_abs_diff=round(err, 4), config=skinny_gemm_config(m, n, k))
            if args.sweep:
                timed = [(graph_us(lambda c=c: skinny_gemm(x, w, c)), c) for c in sweep_configs(m)]
                best_us, best = min(timed, key=lambda t: t[0])
                row.update(best_us=round(best_us, 2), best=best)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
