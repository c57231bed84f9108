"""`python -m nanoserve.benchmarks.prologues` (GPU machine): one decode row at Qwen3-0.6B widths, µs
per call replayed from a CUDA graph, of the skinny GEMV's prologues (worker.kernels.skinny_gemm)
against the two kernels each replaces: silu_and_mul then the down projection; fused_add_rms_norm
then the qkv or gate_up projection. Prints one JSON line per case.
"""

import json
from collections.abc import Callable
from functools import partial

import torch

from nanoserve.benchmarks.gemm import graph_us
from nanoserve.worker.kernels import fused_add_rms_norm, silu_and_mul
from nanoserve.worker.kernels.skinny_gemm import skinny_add_rms_norm_gemm, skinny_gemm

HIDDEN, INTER, QKV = 1024, 3072, 4096  # Qwen3-0.6B


def _norm_then_gemm(x, residual, norm_w, w) -> torch.Tensor:
    return skinny_gemm(fused_add_rms_norm(x, residual, norm_w, 1e-6)[0], w)


def main() -> None:
    torch.manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    gate_up, down_w = randn(1, 2 * INTER), randn(HIDDEN, INTER)
    cases: dict[str, tuple[Callable[[], object], ...]] = {
        "down": (
            lambda: skinny_gemm(gate_up, down_w, silu_and_mul=True),
            lambda: skinny_gemm(silu_and_mul(gate_up), down_w),
            lambda: silu_and_mul(gate_up),
        )
    }
    x, residual, norm_w = randn(1, HIDDEN), randn(1, HIDDEN), randn(HIDDEN)
    for name, n in (("qkv", QKV), ("gate_up", 2 * INTER)):
        w = randn(n, HIDDEN)
        cases[name] = (
            partial(skinny_add_rms_norm_gemm, x, residual, norm_w, 1e-6, w),
            partial(_norm_then_gemm, x, residual, norm_w, w),
            partial(fused_add_rms_norm, x, residual, norm_w, 1e-6),
        )
    for name, (fused, pair, prologue) in cases.items():
        row = {"case": name, "fused_us": round(graph_us(fused), 2)}
        row |= {"pair_us": round(graph_us(pair), 2), "prologue_us": round(graph_us(prologue), 2)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
