"""kernels.paged_decode_attention against the torch reference (worker.layers.attention), run on CPU
by the Triton interpreter: split-K over block boundaries, half precision, padded entries, the
in-kernel merge's arrival counters, and the num_splits rule."""

import pytest
import torch

from nanoserve.worker.kernels import arrival, decode_rules
from nanoserve.worker.layers.attention import paged_attention_torch
from tests.unit.interpreted_kernels import (
    TOL,
    kernels,
    make_block_tables,
    make_cache,
    poison_unused,
    rel_err,
)

DECODE_LENS = [1, 15, 16, 17, 31, 32, 33, 70]  # around block boundaries of 16 and 32, multi-block


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_torch(block_size, group, num_splits):
    gen = torch.Generator().manual_seed(block_size * 10 + group)
    hkv, d = 2, 32
    k_cache, v_cache = make_cache(24, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(DECODE_LENS, block_size, 24, gen, width=6)
    poison_unused(k_cache, v_cache, tables, DECODE_LENS)
    lens = torch.tensor(DECODE_LENS, dtype=torch.int32)
    q = torch.randn(len(DECODE_LENS), group * hkv, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    cu = torch.arange(len(DECODE_LENS) + 1, dtype=torch.int32)
    ref = paged_attention_torch(q, k_cache, v_cache, tables, cu, lens, 0.2)
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision(dtype):
    gen = torch.Generator().manual_seed(7)
    hkv, d, group = 2, 64, 4
    lens_list = [5, 33, 64, 100]
    k_cache, v_cache = make_cache(16, 32, hkv, d, dtype, gen)
    tables = make_block_tables(lens_list, 32, 16, gen)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    q = torch.randn(len(lens_list), group * hkv, d, generator=gen).to(dtype)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5, num_splits=2)
    cu = torch.arange(len(lens_list) + 1, dtype=torch.int32)
    ref = paged_attention_torch(
        q.float(), k_cache.float(), v_cache.float(), tables, cu, lens, d**-0.5
    )
    assert out.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_padded_entries_are_zero_and_never_read(num_splits):
    # CUDA-graph padding: context_len 0 and a table row of zeros (or -1) that must not be
    # dereferenced
    gen = torch.Generator().manual_seed(3)
    hkv, d, group = 2, 16, 2
    k_cache, v_cache = make_cache(8, 16, hkv, d, torch.float32, gen)
    tables = make_block_tables([20, 0, 0, 0], 16, 8, gen, width=4)
    tables[2] = 0
    poison_unused(k_cache, v_cache, tables, [20, 0, 0, 0])
    lens = torch.tensor([20, 0, 0, 0], dtype=torch.int32)
    q = torch.randn(4, group * hkv, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.25, num_splits=num_splits
    )
    ref = paged_attention_torch(
        q[:1], k_cache, v_cache, tables[:1], torch.arange(2, dtype=torch.int32), lens[:1], 0.25
    )
    assert torch.isfinite(out).all()
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    assert rel_err(out[:1], ref) < TOL[torch.float32]


@pytest.mark.parametrize("num_splits", [2, 4, 5, 16])
def test_decode_one_launch_merge_repeats_exactly(num_splits):
    # the last split of each (seq, kv_head) merges in-kernel; a second call equal to the first
    # shows the arrival counters were reset (a stale count would merge early or never)
    gen = torch.Generator().manual_seed(20 + num_splits)
    hkv, d, group, block_size = 2, 32, 4, 16
    lens_list = [1, 16, 37, 70, 0]  # a padded entry last
    k_cache, v_cache = make_cache(16, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(lens_list, block_size, 16, gen, width=5)
    poison_unused(k_cache, v_cache, tables, lens_list)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    q = torch.randn(len(lens_list), group * hkv, d, generator=gen)
    first = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    counters = arrival._COUNTERS[torch.device("cpu")][-1]
    assert counters.numel() >= len(lens_list) * hkv
    assert not counters.any()  # every counter back at zero after the launch
    second = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    assert torch.equal(first, second)
    cu = torch.arange(5, dtype=torch.int32)
    ref = paged_attention_torch(q[:4], k_cache, v_cache, tables[:4], cu, lens[:4], 0.2)
    assert rel_err(first[:4], ref) < TOL[torch.float32]
    assert torch.equal(first[4], torch.zeros_like(first[4]))
    # a smaller batch reuses the same persistent counter buffer
    kernels.paged_decode_attention(
        q[:2], k_cache, v_cache, tables[:2], lens[:2], 0.2, num_splits=num_splits
    )
    assert arrival._COUNTERS[torch.device("cpu")][-1] is counters


def test_decode_counters_never_allocated_during_graph_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setitem(arrival._COUNTERS, torch.device("cuda", 0), [])
    with pytest.raises(RuntimeError, match="arrival counters"):
        arrival.arrival_counters(torch.device("cuda", 0), 64, "paged_decode_attention")


def test_decode_rejects_bad_num_splits():
    with pytest.raises(ValueError, match="num_splits"):
        kernels.paged_decode_attention(
            torch.zeros(1, 2, 16),
            torch.zeros(1, 16, 1, 16),
            torch.zeros(1, 16, 1, 16),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
            1.0,
            num_splits=0,
        )


def test_num_splits_rule_depends_on_shapes_only():
    cpu = torch.device("cpu")
    # 2048 programs already fill 132 SMs twice: shares of 512 tokens balance mixed lengths
    assert kernels.choose_num_splits(256, 8, 4096, cpu) == 8
    assert decode_rules.choose_split_len(256, 8, cpu) == 512
    assert kernels.choose_num_splits(256, 8, 512, cpu) == 1
    assert kernels.choose_num_splits(1, 8, 4096, cpu) == 16
    assert decode_rules.choose_split_len(16, 8, cpu) == 64
    assert kernels.choose_num_splits(16, 8, 4096, cpu) == 3
    assert kernels.choose_num_splits(1, 8, 256, cpu) == 1  # short max context: one share is enough


def test_tile_rule_depends_on_batch_and_cache_dtype_only():
    choose = decode_rules.choose_tiles
    base, small = dict(num_warps=4, num_stages=3), dict(num_warps=4, num_stages=2)
    assert choose(1, 256, torch.bfloat16) == (64, base)  # batch 1..8: the plain tile
    assert choose(8, 256, torch.bfloat16) == (64, base)
    assert choose(9, 256, torch.bfloat16) == (128, small)
    assert choose(16, 256, torch.bfloat16) == (128, small)
    assert choose(64, 256, torch.float16) == (128, small)
    assert choose(65, 256, torch.bfloat16) == (64, base)  # past the rows: the plain tile
    assert choose(256, 256, torch.bfloat16) == (64, base)
    assert choose(16, 16, torch.bfloat16) == (16, small)  # never past the block
    assert choose(16, 256, torch.float8_e4m3fn) == (64, base)  # fp8: the plain tile
    assert choose(16, 256, torch.float32) == (64, small)  # fp32: twice the bytes, 2 stages


@pytest.mark.parametrize("min_split_len", [16, 32, 48])
def test_decode_shares_of_a_shortest_length_match_torch(min_split_len):
    """Mixed lengths under shares of >= min_split_len tokens (rounded to the tile): short sequences
    take one share (stored directly), long ones several (merged), a padded entry none."""
    gen = torch.Generator().manual_seed(min_split_len)
    d, hkv, group, block_size = 16, 2, 2, 16
    lens_list = [1, 15, 17, 33, 70, 96, 0]
    k_cache, v_cache = make_cache(24, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(lens_list, block_size, 24, gen, width=8)
    poison_unused(k_cache, v_cache, tables, lens_list)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    q = torch.randn(len(lens_list), group * hkv, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=4, min_split_len=min_split_len
    )
    n = len(lens_list) - 1
    cu = torch.arange(n + 1, dtype=torch.int32)
    ref = paged_attention_torch(q[:n], k_cache, v_cache, tables[:n], cu, lens[:n], 0.2)
    assert rel_err(out[:n], ref) < TOL[torch.float32]
    assert torch.equal(out[n], torch.zeros_like(out[n]))
    assert not arrival._COUNTERS[torch.device("cpu")][-1].any()
    with pytest.raises(ValueError, match="min_split_len"):
        kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2, min_split_len=0)
