"""Issue 34: the q/k-norm + rotary + KV-store kernel (worker.kernels.qk_norm_rope) by tokens a
program and warps, over a prefill step's tokens, Qwen3-0.6B heads, bf16 cache: µs a call (L2
flushed between calls, as a layer's GEMMs would) and GB/s of the bytes it must move. One JSON line
a config; figures, never pass/fail.

    python -m nanoserve.benchmarks.qk_norm_rope_sweep [--tokens 4000 16384]
"""

import argparse
import json

import torch
import triton

from nanoserve.worker.kernels.qk_norm_rope import qk_norm_rope
from nanoserve.worker.layers.rotary_embedding import RotaryEmbedding

HQ, HKV, D, BLOCK = 16, 8, 128, 256


def sweep(n: int, rows: list[int]) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    qkv = torch.randn(n, (HQ + 2 * HKV) * D, device=dev, dtype=dt)
    q, k, v = (x.view(n, -1, D) for x in qkv.split([HQ * D, HKV * D, HKV * D], dim=1))
    w_q, w_k = (torch.ones(D, device=dev, dtype=dt) for _ in range(2))
    blocks = triton.cdiv(n, BLOCK)
    k_cache, v_cache = (torch.zeros(blocks, BLOCK, HKV, D, device=dev, dtype=dt) for _ in range(2))
    cos_sin = RotaryEmbedding(D, 40960, 1e6).cache_on(dev)
    positions = torch.arange(n, device=dev)
    slots = torch.randperm(blocks * BLOCK, device=dev)[:n].to(torch.int32)
    # read q, k, v; write q, k in place and k, v to the cache (cos / sin and weights: L2)
    moved = n * D * 2 * (HQ + 2 * HKV + HQ + HKV + 2 * HKV)
    reference = None
    out = []
    for r in rows:

        def call(r: int = r) -> None:
            qk_norm_rope(
                q, k, w_q, w_k, cos_sin, positions, 1e-6, v, k_cache, v_cache, slots,
                rows_per_program=r,
            )  # fmt: skip

        snapshot = qkv.clone()
        call()
        result = (qkv.clone(), k_cache.clone())
        qkv.copy_(snapshot)
        same: bool | None = None if reference is None else all(map(torch.equal, result, reference))
        reference = reference or result
        us = triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
        row = dict(
            bench="qk_norm_rope", tokens=n, rows=r, us=round(us, 1), gb_s=round(moved / us / 1e3),
            same_bits_as_first=same,
        )  # fmt: skip
        print(json.dumps(row), flush=True)
        out.append(row)
        qkv.copy_(snapshot)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nanoserve.benchmarks.qk_norm_rope_sweep")
    parser.add_argument("--tokens", type=int, nargs="+", default=[4000, 16384, 256])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 8])
    args = parser.parse_args(argv)
    for n in args.tokens:
        sweep(n, args.rows)


if __name__ == "__main__":
    main()
