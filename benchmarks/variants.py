"""`python -m nanoserve.benchmarks.variants VARIANT [engine flags]` (GPU machine): nano-vllm's throughput
and batch-1 latency (benchmarks.engine) under one variant of the decode kernels' rules, one variant a
process (CUDA graphs capture the rules), so that variants run in the same call compare on the same
machine (the same code moves ~8% between machines). `gpu_run.sh ab` runs AB_VARIANTS in turn.

  before     the decode-attention share rule before 2026-12-01, cuBLAS for every GEMM, the torch sampler
  attn       today's share rule; cuBLAS for every GEMM, the torch sampler
  oldsample  today's code with the torch sampler for plain steps too
  nopdl      the code as it is without programmatic dependent launch (NANOSERVE_PDL=0)
  onetile    the code as it is with one decode-attention tile for every batch (no TILE_RULES)
  cublaslt   the code as it is, torch's cuBLASLt back end for the GEMMs cuBLAS runs
  fp8        the code as it is with the fp8 KV cache (--kv-cache-dtype fp8)
  notrigger  the code as it is without the early launch signal of PDL kernels (pdl.TRIGGER)
  fused      the code as it is with --decode-fusions: a decode row's norms inside the GEMVs after
             them, gate_up with its SiLU, the q/k norms, rotary and KV store inside the attention
  prefetch   the code as it is with the skinny GEMV's weights loaded before the PDL wait
             (worker.kernels.skinny_gemm.PREFETCH_WEIGHTS)
  emptycache the code as it is with torch.cuda.graph's empty_cache before every graph capture
             (runner.graph_capture.EMPTY_CACHE_PER_CAPTURE): the start-up's phases apart
  splits8    the code as it is with at most 8 decode-attention shares a (sequence, kv head) (16):
             at batch 1 and 1,024 tokens, 8 shares of 128 tokens instead of 16 of 64
  splits4    the same with at most 4 shares (4 of 256 tokens)
  blockwait  the code as it is with the host's wait for each step's sampled ids sleeping until the
             GPU signals instead of spinning (worker.runner.host_copy.BLOCKING_WAIT): its cost
  now        the code as it is
"""

import argparse
import os

import torch
import triton

from nanoserve.benchmarks import engine
from nanoserve.worker.kernels import decode_rules, pdl, skinny_gemm, split_k_gemm
from nanoserve.worker.runner import graph_capture, host_copy, sampler

VARIANTS = (
    "before",
    "attn",
    "oldsample",
    "nopdl",
    "onetile",
    "cublaslt",
    "fp8",
    "notrigger",
    "fused",
    "prefetch",
    "emptycache",
    "splits8",
    "splits4",
    "blockwait",
    "now",
)


def old_num_splits(batch: int, num_kv_heads: int, max_context: int, device) -> int:
    """The share count before 2026-12-01: ~2 programs an SM, one share a sequence from 33 up."""
    programs = batch * num_kv_heads
    if programs >= 264:
        return 1
    return max(1, min(-(-264 // programs), decode_rules.MAX_SPLITS, -(-max_context // 256)))


def apply(variant: str) -> None:
    if variant == "before":
        decode_rules.choose_num_splits = old_num_splits
        decode_rules.choose_split_len = lambda *args: 64
    if variant in ("before", "attn", "oldsample", "nopdl", "onetile"):
        decode_rules.TILE_RULES = []  # 64-token tiles and DECODE_CONFIG at every batch
    if variant in ("before", "attn"):
        split_k_gemm.CONFIGS.clear()
    if variant in ("before", "attn", "oldsample"):
        sampler.is_plain = lambda t: False
    if variant in ("before", "attn", "oldsample", "nopdl"):
        os.environ["NANOSERVE_PDL"] = "0"  # read at the first launch (worker.kernels.pdl)
    if variant == "notrigger":
        pdl.TRIGGER = triton.language.constexpr(False)
        # compiled apart: a cached kernel of the other setting must not be loaded
        os.environ["TRITON_CACHE_DIR"] = os.path.expanduser("~/.triton/cache-notrigger")
    if variant == "prefetch":
        skinny_gemm.PREFETCH_WEIGHTS = True
    if variant == "blockwait":
        host_copy.BLOCKING_WAIT = True
    if variant == "emptycache":
        graph_capture.EMPTY_CACHE_PER_CAPTURE = True
    if variant in ("splits8", "splits4"):  # read at each launch's rule (choose_num_splits)
        decode_rules.MAX_SPLITS = int(variant.removeprefix("splits"))
    if variant == "cublaslt":
        torch.backends.cuda.preferred_blas_library("cublaslt")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nanoserve bench variants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("variant", choices=VARIANTS, help="which rules the engine runs under")
    return p


def main(argv: list[str] | None = None) -> None:
    args, engine_args = build_parser().parse_known_args(argv)
    apply(args.variant)
    print(f"=== variant: {args.variant}, split-K shapes {sorted(split_k_gemm.CONFIGS)}", flush=True)
    if args.variant == "fp8":
        engine_args = ["--kv-cache-dtype", "fp8", *engine_args]
    if args.variant == "fused":
        engine_args = ["--decode-fusions", *engine_args]
    engine.main(["throughput", "latency", "--shape", "qwen3-0.6b", "--json", *engine_args])


if __name__ == "__main__":
    main()
