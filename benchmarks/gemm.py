"""`python -m nanoserve.benchmarks.gemm`: small-M linear layers on the GPU machine, cuBLAS (F.linear)
against worker.kernels.skinny_gemm at its chosen tiles and, with --sweep, at a curated candidate list.

Times are L2-cold, as in the model where every weight streams from HBM once per step: a CUDA graph
(a decode step replays one; launch overhead would hide µs kernels) of back-to-back calls that cycle
through enough copies of W and x to touch >= COLD_BYTES (~5x the H200's 50 MB L2) between two reads of
the same copy. GB/s counts the weight bytes read. One JSON line per (shape, M), then a summary table.
"""

import argparse
import itertools
import json
import math
import statistics

import torch
import torch.nn.functional as F

from nanoserve.worker.kernels.skinny_gemm import skinny_gemm, skinny_gemm_config

REPS = 20
COLD_BYTES = 256 << 20
SHAPES = {  # (N, K) of qkv, o, gate_up, down per rank
    "qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
    "qwen3-8b": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
    "qwen3-8b-tp2": [(3072, 4096), (4096, 2048), (12288, 4096), (4096, 6144)],
    "lm-head": [(151936, 1024), (151936, 4096), (75968, 4096)],  # 0.6B, 8B, 8B at tp 2: not swept
}
# (BLOCK_N, BLOCK_K, num_warps, LOOP_STAGES) at M = 1
TILES = [
    (2, 512, 2, 1),
    (2, 512, 4, 1),
    (4, 512, 4, 1),
    (4, 1024, 4, 1),
    (2, 512, 4, 3),
    (4, 512, 4, 3),
    (4, 1024, 4, 2),
    (8, 512, 4, 2),
    (8, 1024, 8, 2),
    (2, 2048, 8, 1),
]


def _replay_us(fn, calls: int, iters: int = 10) -> float:
    """µs per call of fn(i), i = 0..calls-1, captured once in a CUDA graph: the median of iters replays."""
    fn(0)  # compiles outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1000 / calls


def graph_us(fn) -> float:
    """µs per call of fn() replayed REPS times from a CUDA graph (L2-warm if fn reuses its operands)."""
    return _replay_us(lambda i: fn(), REPS)


def sweep_configs(m: int, n: int, k: int) -> list[dict]:
    """The candidate tiles (K is never split: splits never won the H200 sweep)."""
    bm = 1 << (m - 1).bit_length()
    out = []
    for bn, bk, warps, stages in TILES:
        bk = min(bk, 8192 // (bm * bn))  # bounded registers at larger M
        cfg = dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, LOOP_STAGES=stages, num_warps=warps, num_stages=1
        )
        if cfg not in out:
            out.append(cfg)
    return out


def _short(cfg: dict) -> str:
    return f"n{cfg['BLOCK_N']} k{cfg['BLOCK_K']} p{cfg['LOOP_STAGES']} w{cfg['num_warps']}"


def bench_shape(shape: str, m: int, n: int, k: int, sweep: bool) -> dict:
    copies = max(2, math.ceil(COLD_BYTES / (n * k * 2)))
    calls = max(REPS, copies)
    ws = torch.randn(copies, n, k, device="cuda", dtype=torch.bfloat16).unbind(0)
    xk = torch.randn(copies, m, k, device="cuda", dtype=torch.bfloat16).unbind(0)

    def us(cfg: dict | None) -> float:
        return _replay_us(lambda i: skinny_gemm(xk[i % copies], ws[i % copies], cfg), calls)

    def err(cfg: dict | None) -> float:
        ref = F.linear(xk[0], ws[0]).float()
        return round((skinny_gemm(xk[0], ws[0], cfg).float() - ref).abs().max().item(), 4)

    def gb_s(t: float) -> int:
        return round(n * k * 2 / t / 1e3)

    chosen = skinny_gemm_config(m, n, k)
    cublas_us = _replay_us(lambda i: F.linear(xk[i % copies], ws[i % copies]), calls)
    chosen_us = us(chosen)
    row = dict(
        bench="gemm",
        shape=shape,
        m=m,
        n=n,
        k=k,
        copies=copies,
        cublas_us=round(cublas_us, 2),
        cublas_gb_s=gb_s(cublas_us),
        chosen_us=round(chosen_us, 2),
        chosen_gb_s=gb_s(chosen_us),
        chosen=chosen,
        max_abs_diff=err(chosen),
    )
    best_us, best = chosen_us, chosen
    if sweep and shape != "lm-head":
        failed = []
        for cfg in sweep_configs(m, n, k):
            try:
                t = us(cfg)
            except Exception as e:  # noqa: BLE001 - a tile that fails to compile is reported, not fatal
                failed.append(f"{_short(cfg)}: {type(e).__name__}")
                continue
            if t < best_us:
                best_us, best = t, cfg
        row.update(
            best_us=round(best_us, 2),
            best_gb_s=gb_s(best_us),
            best=best,
            best_max_abs_diff=err(best),
            failed=failed,
        )
    return row


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench gemm", description=__doc__)
    p.add_argument(
        "--shapes",
        nargs="*",
        default=list(SHAPES),
        choices=list(SHAPES),
        help="model shapes whose linear layers are timed (default: all)",
    )
    p.add_argument(
        "--m",
        type=int,
        nargs="*",
        default=[1, 2, 4, 8],
        help="rows (tokens) of the activations timed (default: 1 2 4 8)",
    )
    p.add_argument(
        "--sweep", action="store_true", help="also time the candidate tiles (not LM heads)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for shape in args.shapes:
        for (n, k), m in itertools.product(SHAPES[shape], args.m):
            rows.append(bench_shape(shape, m, n, k, args.sweep))
            torch.cuda.empty_cache()  # the shape's weight copies are freed with its frame
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{'shape':<13} {'m':>2} {'N x K':>13} {'cuBLAS µs':>10} {'chosen':>8} {'best':>8} "
        f"{'best/cuBLAS':>11}  best tile  (L2-cold; GB/s of W in the JSON)"
    )
    for r in rows:
        best = r.get("best_us", r["chosen_us"])
        line = (
            f"{r['shape']:<13} {r['m']:>2} {r['n']:>6}x{r['k']:<6} {r['cublas_us']:>10.2f} "
            f"{r['chosen_us']:>8.2f} {best:>8.2f} {best / r['cublas_us']:>11.2f}  "
            f"{_short(r.get('best', r['chosen']))}"
        )
        print(line)


if __name__ == "__main__":
    main()
