"""Issue 34: the prefill attention's candidates over one step's prompts, nothing cached, Qwen3-0.6B
heads: our Triton paged kernel against torch's SDPA backends (one prompt) and torch's varlen
flash attention (contiguous and paged). One JSON line each: µs, TFLOP/s, largest difference."""

import argparse
import inspect
import itertools
import json
import random
from collections.abc import Callable

import torch
import triton

from nanoserve.benchmarks import workload
from nanoserve.benchmarks.attention import _paged_case
from nanoserve.worker.kernels.prefill_attention import paged_prefill_attention

HQ, HKV, D, BLOCK = 16, 8, 128, 256


def _varlen(kwargs: dict):
    """torch's varlen flash attention with `kwargs`, causal, GQA; None where this torch lacks it
    (or lacks a keyword: paged KV came after the first release)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    attn: Callable[..., object] = varlen_attn
    params = inspect.signature(attn).parameters
    if not set(kwargs) <= set(params):
        return None
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    # GQA: a keyword in later releases; the first takes fewer k/v heads as they come (flash-attn's)
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}
    return lambda *a: attn(*a, scale=D**-0.5, **gqa, **causal, **kwargs)


def compare(prompt_len: int = 4000, tokens: int = 16384, seed: int = 0) -> list[dict]:
    """One prompt of `prompt_len` tokens, or (0) one step of the throughput workload's prompts."""
    lens = [prompt_len] if prompt_len > 0 else workload.step_lengths(tokens, random.Random(seed))
    k_cache, v_cache, tables, ctx = _paged_case(lens, HKV, D, BLOCK, torch.bfloat16, 1)
    q = torch.randn(sum(lens), HQ, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    # the same keys and values, laid out contiguously: (tokens, HKV, D)
    k, v = (
        torch.cat(
            [c[tables[i, : triton.cdiv(n, BLOCK)]].flatten(0, 1)[:n] for i, n in enumerate(lens)]
        )
        for c in (k_cache, v_cache)
    )
    flops = 4 * D * HQ * sum(n * (n + 1) // 2 for n in lens)
    top = max(lens)
    ours = lambda: paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx, D**-0.5)
    cases: dict[str, object] = {"triton_paged": ours}
    if (f := _varlen({})) is not None:
        cases["varlen_flash"] = lambda: f(q, k, v, cu, cu, top, top)
    if (g := _varlen({"block_table": tables, "seqused_k": ctx})) is not None:
        cases["varlen_flash_paged"] = lambda: g(q, k_cache, v_cache, cu, None, top, top)
    if len(lens) == 1:  # SDPA has no ragged batch: one prompt, (1, heads, tokens, D)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]
        for backend in [*backends, SDPBackend.EFFICIENT_ATTENTION]:

            def sdpa(backend: SDPBackend = backend) -> torch.Tensor:
                with sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=True, scale=D**-0.5, enable_gqa=True
                    )
                return out.transpose(1, 2).squeeze(0)

            cases[f"sdpa_{backend.name.lower()}"] = sdpa
    reference = ours().float()
    rows = []
    for name, fn in cases.items():
        row: dict = dict(bench="prefill_backend", backend=name, seqs=len(lens), tokens=sum(lens))
        try:
            diff = (fn().float() - reference).abs().max().item()  # type: ignore[operator]
            ms = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")
            row.update(us=round(ms * 1e3, 1), tflop_s=round(flops / ms / 1e9, 1), max_diff=diff)
        except Exception as e:  # noqa: BLE001 - a backend this torch or GPU lacks: say so, go on
            row.update(error=f"{type(e).__name__}: {e}"[:200])
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def plan_times(lengths: list[int], contiguous: bool) -> list[dict]:
    """Start-up's cost of the SDPA prefill graphs, one term of it: the first cuDNN SDPA call of each
    length (cuDNN builds an execution plan per shape; torch caches it per thread) against the second,
    in this process's order, as Attention.sdpa_prefill calls it: q, k, v the qkv projection's column
    slices, or (contiguous) each copied dense first. TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 in the
    environment (torch's opt-in: one plan for lengths up to the same power of two, BSHD-dense
    inputs only) is what a second run compares."""
    import os
    import time

    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for n in lengths:
        qkv = torch.randn(n, (HQ + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
        q, k, v = (x.view(n, -1, D) for x in (q, k, v))
        if contiguous:
            q, k, v = (x.contiguous() for x in (q, k, v))
        qt, kt, vt = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True, scale=D**-0.5, enable_gqa=True
                )
            torch.cuda.synchronize()
            times.append(round((time.perf_counter() - t) * 1e3, 2))
        row = dict(
            bench="sdpa_plan",
            tokens=n,
            contiguous=contiguous,
            avoid_recompile=os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", ""),
            first_ms=times[0],
            second_ms=times[1],
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nanoserve.benchmarks.prefill_backends")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[4000, 1500, 0])
    parser.add_argument(
        "--plan-times",
        action="store_true",
        help="instead: each prompt length's first and second cuDNN SDPA call (plan build), as the "
        "attention calls it, then with q, k, v dense (--contiguous)",
    )
    parser.add_argument("--contiguous", action="store_true", help="--plan-times: q, k, v dense")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.plan_times:
        plan_times(args.prompt_lens, args.contiguous)
        return
    for n in args.prompt_lens:
        compare(n)


if __name__ == "__main__":
    main()
