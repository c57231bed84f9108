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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nanoserve.benchmarks.prefill_backends")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[4000, 1500, 0])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    for n in args.prompt_lens:
        compare(n)


if __name__ == "__main__":
    main()
