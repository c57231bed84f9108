"""benchmarks/variants.py: each variant swaps in exactly its rules (the engine bench itself runs on
the GPU machine only)."""

import os

import pytest
import torch

from nanoserve.benchmarks import variants
from nanoserve.worker.kernels import decode_rules, skinny_gemm, split_k_gemm
from nanoserve.worker.runner import graph_capture, host_copy, sampler


@pytest.fixture
def restored(monkeypatch):
    """Whatever apply() replaces comes back after the test."""
    for module, name in [
        (decode_rules, "choose_num_splits"),
        (decode_rules, "choose_split_len"),
        (sampler, "is_plain"),
        (graph_capture, "EMPTY_CACHE_PER_CAPTURE"),
        (skinny_gemm, "PREFETCH_WEIGHTS"),
        (decode_rules, "MAX_SPLITS"),
        (host_copy, "BLOCKING_WAIT"),
    ]:
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(split_k_gemm, "CONFIGS", dict(split_k_gemm.CONFIGS))
    monkeypatch.setattr(decode_rules, "TILE_RULES", list(decode_rules.TILE_RULES))
    monkeypatch.delenv("NANOSERVE_PDL", raising=False)  # apply() may set it; it comes back
    # the BLAS back end is process-wide (and a CPU build refuses cuBLASLt): record what is asked
    chosen: list[str] = []
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", chosen.append)
    return chosen


@pytest.mark.parametrize("variant", variants.VARIANTS)
def test_each_variant_swaps_its_rules(restored, variant):
    rule, table, plain = decode_rules.choose_num_splits, split_k_gemm.CONFIGS, sampler.is_plain
    assert table  # the shipped split-K table
    variants.apply(variant)
    assert (decode_rules.choose_num_splits is not rule) == (variant == "before")
    assert (not split_k_gemm.CONFIGS) == (variant in ("before", "attn"))
    assert (sampler.is_plain is not plain) == (variant in ("before", "attn", "oldsample"))
    pdl_off = variant in ("before", "attn", "oldsample", "nopdl")
    assert (os.environ.get("NANOSERVE_PDL") == "0") == pdl_off  # worker.kernels.pdl
    assert (not decode_rules.TILE_RULES) == (pdl_off or variant == "onetile")
    assert graph_capture.EMPTY_CACHE_PER_CAPTURE == (variant == "emptycache")
    assert skinny_gemm.PREFETCH_WEIGHTS == (variant == "prefetch")
    assert host_copy.BLOCKING_WAIT == (variant == "blockwait")
    assert decode_rules.MAX_SPLITS == {"splits8": 8, "splits4": 4}.get(variant, 16)
    assert restored == (["cublaslt"] if variant == "cublaslt" else [])


def test_the_old_share_rule():
    assert variants.old_num_splits(256, 8, 4096, None) == 1  # one share a sequence from 33 up
    assert variants.old_num_splits(16, 8, 4096, None) == 3
    assert variants.old_num_splits(1, 8, 4096, None) == 16
    assert variants.old_num_splits(1, 8, 256, None) == 1


@pytest.mark.parametrize("variant, flags", [("fused", ["--decode-fusions"]), ("now", [])])
def test_engine_flags_of_a_variant(restored, monkeypatch, variant, flags):
    seen: list[list[str]] = []
    monkeypatch.setattr(variants.engine, "main", seen.append)
    variants.main([variant, "--max-num-seqs", "64"])
    assert seen == [
        ["throughput", "latency", "--shape", "qwen3-0.6b", "--json", *flags, "--max-num-seqs", "64"]
    ]


@pytest.mark.parametrize("variant, shares", [("now", 16), ("splits8", 8), ("splits4", 4)])
def test_a_share_cap_changes_batch_1_shares(restored, variant, shares):
    """Batch 1, 8 kv heads, a 40,960-token limit: the cap is what binds (33 would fill the SMs)."""
    variants.apply(variant)
    assert decode_rules.choose_num_splits(1, 8, 40960, torch.device("cpu")) == shares
