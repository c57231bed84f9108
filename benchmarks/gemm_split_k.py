"""`python -m nanoserve.benchmarks.gemm_split_k`: the linear layers of decode batches (M = 16..256 rows)
on the GPU machine, cuBLAS (F.linear) against worker.kernels.split_k_gemm over a grid of tiles and
split counts, and cuBLASLt (torch's other BLAS back end) beside cuBLAS; L2-cold CUDA-graph timing as
benchmarks.gemm. Prints one JSON line per (shape, M) and a table: cuBLAS µs, cuBLASLt µs, the best
tile's µs and its ratio to cuBLAS (below 1: the Triton kernel is faster). `--blas-only`: the two
BLAS back ends alone (seconds, not minutes).
`--table PATH` writes worker.kernels.split_k_gemm.CONFIGS's entries as JSON: per (N, K) and swept M,
the best config where it beats cuBLAS by WIN, else null (cuBLAS).
"""

import argparse
import itertools
import json
import math

import torch
import torch.nn.functional as F

from nanoserve.benchmarks.gemm import COLD_BYTES, REPS, SHAPES, _replay_us
from nanoserve.worker.kernels.split_k_gemm import split_k_gemm

# (BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = [(32, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3)]
SPLITS = (1, 2, 4, 8, 16)
WIN = 0.95  # the Triton kernel's time against cuBLAS's below which the table takes it


def candidates(m: int, k: int) -> list[dict]:
    bms = sorted({min(128, max(16, 1 << (m - 1).bit_length())), min(64, max(16, m))})
    out = []
    for bm, (bn, bk, warps, stages), split in itertools.product(bms, TILES, SPLITS):
        if bm & (bm - 1) or k % (split * bk):
            continue
        out.append(
            dict(
                BLOCK_M=bm,
                BLOCK_N=bn,
                BLOCK_K=bk,
                SPLIT_K=split,
                num_warps=warps,
                num_stages=stages,
            )
        )
    return out


def short(cfg: dict) -> str:
    return (
        f"m{cfg['BLOCK_M']} n{cfg['BLOCK_N']} k{cfg['BLOCK_K']} s{cfg['SPLIT_K']} "
        f"w{cfg['num_warps']} p{cfg['num_stages']}"
    )


def _cublaslt_us(fn, calls: int) -> float:
    """fn's µs with torch's cuBLASLt back end (the graph captures the kernel it picks)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return _replay_us(fn, calls)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def bench_shape(shape: str, m: int, n: int, k: int, blas_only: bool = False) -> dict:
    copies = max(2, math.ceil(COLD_BYTES / (n * k * 2)))
    calls = max(REPS, copies)
    ws = torch.randn(copies, n, k, device="cuda", dtype=torch.bfloat16).unbind(0)
    xs = torch.randn(copies, m, k, device="cuda", dtype=torch.bfloat16).unbind(0)
    ref = F.linear(xs[0], ws[0]).float()
    cublas = _replay_us(lambda i: F.linear(xs[i % copies], ws[i % copies]), calls)
    cublaslt = _cublaslt_us(lambda i: F.linear(xs[i % copies], ws[i % copies]), calls)
    times, failed = [], []
    for cfg in [] if blas_only else candidates(m, k):
        try:
            err = (split_k_gemm(xs[0], ws[0], cfg).float() - ref).abs().max().item()
            t = _replay_us(lambda i, c=cfg: split_k_gemm(xs[i % copies], ws[i % copies], c), calls)
        except Exception as e:  # noqa: BLE001 - a tile that fails to compile is reported, not fatal
            failed.append(f"{short(cfg)}: {type(e).__name__}")
            continue
        times.append((t, cfg, err))
    times.sort(key=lambda r: r[0])
    best_us, best, best_err = times[0] if times else (float("nan"), {}, float("nan"))
    return dict(
        bench="gemm_split_k",
        shape=shape,
        m=m,
        n=n,
        k=k,
        cublas_us=round(cublas, 2),
        cublaslt_us=round(cublaslt, 2),
        best_us=round(best_us, 2),
        best=best,
        best_max_abs_diff=round(best_err, 4),
        top=[(round(t, 2), short(c)) for t, c, _ in times[:5]],
        failed=failed,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench gemm-split-k", description=__doc__)
    p.add_argument(
        "--shapes",
        nargs="*",
        default=["qwen3-0.6b"],
        choices=list(SHAPES)[:3],
        help="layer shapes to sweep (qkv, o, gate_up, down of each)",
    )
    p.add_argument(
        "--m",
        type=int,
        nargs="*",
        default=[16, 32, 48, 64, 96, 128, 192, 256],
        help="decode rows to sweep (the graph buckets are 16 apart up to 256)",
    )
    p.add_argument(
        "--blas-only", action="store_true", help="time cuBLAS and cuBLASLt only, no Triton tiles"
    )
    p.add_argument("--table", help="write the winning configs here (JSON, CONFIGS's layout)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for shape in args.shapes:
        for (n, k), m in itertools.product(SHAPES[shape], args.m):
            rows.append(bench_shape(shape, m, n, k, args.blas_only))
            torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
    if args.table:
        table: dict[str, list] = {}
        for r in sorted(rows, key=lambda r: r["m"]):
            win = r["best"] and r["best_us"] < WIN * r["cublas_us"]
            table.setdefault(f"{r['n']},{r['k']}", []).append([r["m"], r["best"] if win else None])
        with open(args.table, "w") as f:
            json.dump(table, f)
    print(
        f"\n{'shape':<12} {'m':>3} {'N x K':>11} {'cuBLAS':>7} {'Lt':>7} {'best':>7} {'ratio':>5}"
        "  best tile"
    )
    for r in rows:
        print(
            f"{r['shape']:<12} {r['m']:>3} {r['n']:>5}x{r['k']:<5} {r['cublas_us']:>7.2f} "
            f"{r['cublaslt_us']:>7.2f} "
            f"{r['best_us']:>7.2f} {r['best_us'] / r['cublas_us']:>5.2f}  {short(r['best']) if r['best'] else '-'}"
        )


if __name__ == "__main__":
    main()
