"""Kernel timings for worker.kernels attention on the GPU machine: `python -m
nanoserve.benchmarks.attention`.

Decode is bound by K/V bytes, so it reports achieved GB/s (K/V bytes read / median time); prefill reports TFLOP/s.
"""

import argparse
import itertools
import random

import torch
import triton

from nanoserve.benchmarks import workload
from nanoserve.worker.kernels import (
    choose_num_splits,
    paged_decode_attention,
    paged_prefill_attention,
)


def _paged_case(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    width: int,
):
    need = [triton.cdiv(n, block_size) for n in context_lens]
    num_blocks = sum(need)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(
        shape, device="cuda", dtype=dtype
    )  # random, never zeros: zeros can time faster
    v_cache = torch.randn(shape, device="cuda", dtype=dtype)
    perm = torch.randperm(num_blocks, device="cuda").int()
    tables = torch.full(
        (len(context_lens), max(width, max(need))), -1, dtype=torch.int32, device="cuda"
    )
    used = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = perm[used : used + nb]
        used += nb
    lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, tables, lens


def bench_decode(
    batch: int = 256,
    context: int = 1024,
    num_q_heads: int = 16,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 256,
    max_model_len: int = 4096,
    dtype: torch.dtype = torch.bfloat16,
    num_splits: int | None = None,
) -> float:
    """Median µs of one decode attention call; block_tables are as wide as max_model_len (the graph layout)."""
    k_cache, v_cache, tables, lens = _paged_case(
        [context] * batch,
        num_kv_heads,
        head_dim,
        block_size,
        dtype,
        triton.cdiv(max_model_len, block_size),
    )
    q = torch.randn(batch, num_q_heads, head_dim, device="cuda", dtype=dtype)
    splits = num_splits or choose_num_splits(
        batch, num_kv_heads, tables.shape[1] * block_size, q.device
    )
    fn = lambda: paged_decode_attention(
        q, k_cache, v_cache, tables, lens, head_dim**-0.5, num_splits
    )
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k_cache.element_size()
    print(
        f"decode  B={batch:4d} ctx={context:5d} Hq={num_q_heads:2d} Hkv={num_kv_heads} D={head_dim} "
        f"splits={splits:2d}: {ms * 1e3:8.1f} us  {kv_bytes / ms / 1e6:7.0f} GB/s"
    )
    return ms * 1e3


def bench_prefill(
    num_seqs: int = 16,
    prompt_len: int = 1024,
    prefix_len: int = 0,
    num_q_heads: int = 16,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> float:
    """Median µs of one prefill call over num_seqs prompts of prompt_len new tokens after prefix_len cached."""
    context = prefix_len + prompt_len
    k_cache, v_cache, tables, lens = _paged_case(
        [context] * num_seqs, num_kv_heads, head_dim, block_size, dtype, 1
    )
    q = torch.randn(num_seqs * prompt_len, num_q_heads, head_dim, device="cuda", dtype=dtype)
    cu = torch.arange(0, num_seqs + 1, dtype=torch.int32, device="cuda") * prompt_len
    fn = lambda: paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, head_dim**-0.5)
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    # causal QK^T and PV: 4 * D flops per visible (query, key) pair per q head
    pairs = num_seqs * (prompt_len * prefix_len + prompt_len * (prompt_len + 1) // 2)
    flops = 4 * head_dim * num_q_heads * pairs
    print(
        f"prefill S={num_seqs:3d} q={prompt_len:5d} prefix={prefix_len:5d} Hq={num_q_heads:2d} "
        f"Hkv={num_kv_heads}: {ms * 1e3:8.1f} us  {flops / ms / 1e9:6.1f} TFLOP/s"
    )
    return ms * 1e3


def sweep_small_batch_splits() -> None:
    """Batch-1..4 decode is latency-bound: µs per call from a CUDA graph (as a decode step runs it)
    for each split count, at the rule's choice marked *."""
    from nanoserve.benchmarks.gemm import graph_us

    for hq, hkv in ((16, 8), (16, 4)):  # Qwen3-0.6B; Qwen3-8B per rank at tensor-parallel 2
        for batch, context in ((1, 1024), (1, 4096), (4, 1024)):
            k_cache, v_cache, tables, lens = _paged_case(
                [context] * batch, hkv, 128, 256, torch.bfloat16, 16
            )
            q = torch.randn(batch, hq, 128, device="cuda", dtype=torch.bfloat16)
            rule = choose_num_splits(batch, hkv, tables.shape[1] * 256, q.device)
            times = {
                n: graph_us(
                    lambda n=n: paged_decode_attention(
                        q, k_cache, v_cache, tables, lens, 128**-0.5, n
                    )
                )
                for n in (1, 2, 4, 8, 16, 32)
            }
            row = "  ".join(f"{n}{'*' if n == rule else ''}: {t:5.1f}" for n, t in times.items())
            print(f"decode graph B={batch} ctx={context} Hq={hq} Hkv={hkv} us by splits  {row}")


def sweep_mixed_lengths() -> None:
    """A decode batch of mixed lengths (uniform 100..2048, as nano-vllm's workload mid-run), from a
    CUDA graph with max_model_len-wide tables: the length-balanced shares against one share a sequence at batches that fill the GPU (the rule before 2026-12-01:
    min_split_len 64, one split from 33 sequences up), and the rule at 64- and 128-token tiles over
    an fp8 and a bf16 cache of the same lengths. GB/s counts the bf16 K/V bytes read."""
    from nanoserve.benchmarks.gemm import graph_us

    gen = torch.Generator().manual_seed(7)
    for batch in (16, 32, 64, 128, 256):
        lens = torch.randint(100, 2049, (batch,), generator=gen).tolist()
        k_cache, v_cache, tables, ctx = _paged_case(lens, 8, 128, 256, torch.bfloat16, 16)
        q = torch.randn(batch, 16, 128, device="cuda", dtype=torch.bfloat16)
        old = 1 if batch * 8 >= 264 else min(triton.cdiv(264, batch * 8), 16)
        variants = {"before": (old, 64), "rule": (None, None)}
        kv_bytes = 2 * sum(lens) * 8 * 128 * 2
        caches = {
            "fp8": (k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)),
            "bf16": (k_cache, v_cache),
        }
        row = []
        for name, (k, v) in caches.items():
            for block_n in (64, 128):
                us = graph_us(
                    lambda k=k, v=v, b=block_n: paged_decode_attention(
                        q, k, v, tables, ctx, 128**-0.5, k_scale=0.5, v_scale=0.5, block_n=b
                    )
                )
                row.append(f"{name} tile {block_n} {us:6.1f} us")
        for name, (splits, min_len) in variants.items():
            us = graph_us(
                lambda s=splits, m=min_len: paged_decode_attention(
                    q, k_cache, v_cache, tables, ctx, 128**-0.5, s, min_split_len=m
                )
            )
            row.append(f"{name} {us:6.1f} us {kv_bytes / us / 1e3:5.0f} GB/s")
        print(
            f"decode mixed B={batch:3d} ctx 100..2048 (mean {sum(lens) / batch:.0f}): "
            + " | ".join(row)
        )


def sweep_decode_configs(seed: int = 7) -> list[dict]:
    """The decode kernel's tile and launch options (block_n, num_warps, num_stages) over decode
    batches of the throughput workload: uniform B=256 at 1,024 tokens, and mixed lengths
    100..2048 at B=256, 192, 160, 128, 64 and 16 (the batch shrinking), CUDA graph,
    max_model_len-wide tables as the engine's. Prints µs and GB/s a case, best first, the rule's choice marked *
    (choose_tiles), and the µs of DECODE_CONFIG's 64-token tiles."""
    from nanoserve.benchmarks.gemm import graph_us
    from nanoserve.worker.kernels.decode_rules import DECODE_CONFIG, choose_tiles

    gen = torch.Generator().manual_seed(seed)
    cases = {"B=256 ctx 1024": [1024] * 256}
    for batch in (256, 192, 160, 128, 64, 16):
        cases[f"B={batch} mixed"] = torch.randint(100, 2049, (batch,), generator=gen).tolist()
    options = list(itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4)))
    rows = []
    for name, lens in cases.items():
        k_cache, v_cache, tables, ctx = _paged_case(lens, 8, 128, 256, torch.bfloat16, 16)
        q = torch.randn(len(lens), 16, 128, device="cuda", dtype=torch.bfloat16)
        kv_bytes = 2 * sum(lens) * 8 * 128 * 2
        timed = []
        rule_n, rule_cfg = choose_tiles(len(lens), 256, torch.bfloat16)
        plain = float("nan")
        for block_n, warps, stages in options:
            cfg = dict(num_warps=warps, num_stages=stages)
            try:
                us = graph_us(
                    lambda b=block_n, c=cfg: paged_decode_attention(
                        q, k_cache, v_cache, tables, ctx, 128**-0.5, block_n=b, config=c
                    )
                )
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: reported, not fatal
                print(f"decode {name} n{block_n} w{warps} p{stages}: {type(e).__name__}")
                continue
            if block_n == 64 and cfg == DECODE_CONFIG:
                plain = us
            timed.append((us, block_n, warps, stages, block_n == rule_n and cfg == rule_cfg))
        timed.sort()
        for us, block_n, warps, stages, default in timed[:6] + [t for t in timed if t[4]]:
            rows.append(dict(case=name, block_n=block_n, num_warps=warps, num_stages=stages, us=us))
        top = "  ".join(
            f"n{b} w{w} p{p}{'*' if d else ''} {us:6.1f}" for us, b, w, p, d in timed[:6]
        )
        mine = next((us for us, *_, d in timed if d), float("nan"))
        print(
            f"decode configs {name}: rule {mine:6.1f} us ({kv_bytes / mine / 1e3:5.0f} GB/s), "
            f"n64 w4 p3 {plain:6.1f}; best {top}  ({kv_bytes / timed[0][0] / 1e3:5.0f} GB/s)",
            flush=True,
        )
    return rows


def sweep_prefill_configs(tokens: int = 16384, seed: int = 0, prompt_len: int = 0) -> list[dict]:
    """The prefill kernel over one step of the throughput workload (prompts of 100..1024 tokens
    filling `tokens`), or over one prompt of `prompt_len` tokens when > 0; nothing cached,
    Qwen3-0.6B heads; under each config of a grid: µs and TFLOP/s per config, the default first.
    Prints one JSON line per config."""
    import json

    from nanoserve.worker.kernels.prefill_attention import PREFILL_CONFIG

    lens = [prompt_len] if prompt_len > 0 else workload.step_lengths(tokens, random.Random(seed))
    hq, hkv, d = 16, 8, 128
    k_cache, v_cache, tables, ctx = _paged_case(lens, hkv, d, 256, torch.bfloat16, 1)
    q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    flops = 4 * d * hq * sum(n * (n + 1) // 2 for n in lens)
    grid: list[dict] = [{}] + [
        dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, HEAVY_FIRST=hf)
        for bm in (64, 128)
        for bn in (64, 128)
        for w in (4, 8)
        for st in (2, 3)
        for hf in (False, True)
    ]
    out = []
    for config in grid:
        fn = lambda: paged_prefill_attention(
            q, k_cache, v_cache, tables, cu, ctx, d**-0.5, config=config
        )
        try:
            ms = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")
        except triton.runtime.errors.OutOfResources as e:  # a tile past shared memory
            print(json.dumps(dict(bench="prefill_config", config=config, error=str(e)[:80])))
            continue
        row = dict(
            bench="prefill_config",
            config=config or dict(PREFILL_CONFIG, default=True),
            seqs=len(lens),
            us=round(ms * 1e3, 1),
            tflop_s=round(flops / ms / 1e9, 1),
        )
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="nanoserve bench attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # no flags: it sweeps a fixed grid of batches, contexts and head counts


def main(argv: list[str] | None = None) -> None:
    build_parser().parse_args(argv)
    torch.manual_seed(0)
    sweep_mixed_lengths()
    sweep_small_batch_splits()
    for hq in (16, 32):  # Qwen3-0.6B, Qwen3-8B
        for batch, context in [
            (1, 1024),
            (1, 4096),
            (8, 1024),
            (16, 2048),
            (64, 1024),
            (128, 1024),
            (256, 900),
            (256, 1024),
            (512, 1024),
        ]:
            bench_decode(batch, context, num_q_heads=hq)
    for splits in (1, 2, 4, 8, 16):  # the split rule's neighbourhood at a mid-size batch
        bench_decode(32, 2048, num_splits=splits)
    for hq in (16, 32):
        bench_prefill(16, 1024, num_q_heads=hq)
        bench_prefill(4, 4096, num_q_heads=hq)
        bench_prefill(16, 256, prefix_len=2048, num_q_heads=hq)


if __name__ == "__main__":
    main()
