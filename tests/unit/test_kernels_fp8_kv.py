"""An fp8 (e4m3) KV cache with per-tensor scales, on CPU under the Triton interpreter: the stores
round-trip k and v within fp8's precision, and the paged prefill / decode attention over the fp8 cache
equal the torch reference over the same cache (kv_cache_dtype=fp8)."""

import pytest
import torch

from nanoserve.worker.kernels import decode_rules
from nanoserve.worker.layers.attention import paged_attention_torch, store_kvcache_torch
from tests.unit.interpreted_kernels import kernels, make_block_tables, rel_err

FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.5, 2.0


def representable(shape, scale: float, gen) -> torch.Tensor:
    """bf16 values that are exactly scale * (an e4m3 value): the store must keep them bit for bit.
    (Triton 3.6's interpreter rounds fp32 -> fp8 without carrying into the exponent, e.g. 0.99 -> 0.5,
    so rounding itself is left to the GPU accuracy check, tests/gpu/test_fp8_kv_gpu.py.)"""
    return ((torch.randn(shape, generator=gen) * 3).to(FP8).float() * scale).bfloat16()


def test_store_round_trips_and_matches_torch():
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, hkv, d, n = 4, 16, 2, 32, 9
    key = representable((n, hkv, d), K_SCALE, gen)
    value = representable((n, hkv, d), V_SCALE, gen)
    slots = torch.tensor([3, -1, 17, 40, -1, 60, 16, 15, -1], dtype=torch.int32)
    k_cache = torch.zeros(num_blocks, block_size, hkv, d, dtype=FP8)
    v_cache = torch.zeros_like(k_cache)
    kernels.store_kvcache(key, value, k_cache, v_cache, slots, K_SCALE, V_SCALE)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    store_kvcache_torch(key, value, ref_k, ref_v, slots, K_SCALE, V_SCALE)
    assert torch.equal(k_cache.view(torch.uint8), ref_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), ref_v.view(torch.uint8))
    valid = slots >= 0
    flat = slots[valid].long()
    for cache, x, scale in ((k_cache, key, K_SCALE), (v_cache, value, V_SCALE)):
        assert torch.equal(cache.float().view(-1, hkv, d)[flat] * scale, x[valid].float())
    # padded slots stored nothing
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[flat] = False
    assert not k_cache.view(-1, hkv, d)[untouched].float().any()


def test_fused_qk_norm_rope_store_writes_the_scaled_fp8_cache():
    """qk_norm_rope's cache store (the Triton path's only store) equals store_kvcache's."""
    gen = torch.Generator().manual_seed(3)
    n, hq, hkv, d = 5, 4, 2, 16
    q = torch.randn(n, hq, d, generator=gen)
    # +-1 entries: the head's RMS is 1, so (eps 0, weight 1, no rotation) k leaves the norm exact
    k = torch.randint(0, 2, (n, hkv, d), generator=gen).float() * 2 - 1
    v = representable((n, hkv, d), V_SCALE, gen).float()
    cos_sin = torch.cat([torch.ones(64, d // 2), torch.zeros(64, d // 2)], dim=1)  # no rotation
    k_cache = torch.zeros(3, 8, hkv, d, dtype=FP8)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([0, 9, -1, 23, 4], dtype=torch.int32)
    ones = torch.ones(d)
    kernels.qk_norm_rope(
        q,
        k,
        ones,
        ones,
        cos_sin,
        torch.arange(n),
        0.0,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slots,
        k_scale=K_SCALE,
        v_scale=V_SCALE,
    )
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    store_kvcache_torch(k, v, ref_k, ref_v, slots, K_SCALE, V_SCALE)  # k: normed in place
    assert torch.equal(v_cache.view(torch.uint8), ref_v.view(torch.uint8))
    assert torch.equal(k_cache.view(torch.uint8), ref_k.view(torch.uint8))
    assert k_cache.float().abs().max() == 1 / K_SCALE


def fp8_cache(num_blocks, block_size, hkv, d, gen):
    k = (torch.randn(num_blocks, block_size, hkv, d, generator=gen) / K_SCALE).to(FP8)
    v = (torch.randn(num_blocks, block_size, hkv, d, generator=gen) / V_SCALE).to(FP8)
    return k, v


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_prefill_over_fp8_cache_matches_torch(q_dtype):
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, hq, hkv, d = 12, 16, 4, 2, 32
    k_cache, v_cache = fp8_cache(num_blocks, block_size, hkv, d, gen)
    q_lens, ctx_lens = [5, 20, 1], [5, 37, 18]  # a prompt, an extend over a prefix, one token
    tables = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    cu = torch.tensor([0, 5, 25, 26], dtype=torch.int32)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(q_dtype)
    out = kernels.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        cu,
        lens,
        d**-0.5,
        k_scale=K_SCALE,
        v_scale=V_SCALE,
    )
    ref = paged_attention_torch(
        q.float(), k_cache, v_cache, tables, cu, lens, d**-0.5, K_SCALE, V_SCALE
    )
    assert out.dtype == q_dtype
    assert rel_err(out, ref) < (1e-4 if q_dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_over_fp8_cache_matches_torch(num_splits):
    gen = torch.Generator().manual_seed(2)
    num_blocks, block_size, hq, hkv, d = 12, 16, 4, 2, 32
    k_cache, v_cache = fp8_cache(num_blocks, block_size, hkv, d, gen)
    ctx_lens = [1, 40, 17]
    tables = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    q = torch.randn(3, hq, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, d**-0.5, num_splits, k_scale=K_SCALE, v_scale=V_SCALE
    )
    ref = paged_attention_torch(
        q,
        k_cache,
        v_cache,
        tables,
        torch.arange(4, dtype=torch.int32),
        lens,
        d**-0.5,
        K_SCALE,
        V_SCALE,
    )
    assert rel_err(out, ref) < 1e-4


def test_engine_with_fp8_cache_allocates_fp8_and_generates(tiny_model_dir):
    """kv_cache_dtype=fp8 end to end on CPU (torch backend): an e4m3 cache of a quarter of fp32's
    bytes that the prompts' k/v reach; agreement with the unquantised cache is measured on the GPU
    (tests/gpu/test_fp8_kv_gpu.py)."""
    from nanoserve.worker import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3] * 20]
    runs = {}
    for kv in ("auto", "fp8"):
        llm = LLM(
            tiny_model_dir,
            device="cpu",
            kvcache_block_size=16,
            num_kvcache_blocks=16,
            kv_cache_dtype=kv,
        )
        runs[kv] = (
            llm.model_runner,
            [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)],
        )
    (ref_runner, _), (runner, out) = runs["auto"], runs["fp8"]
    assert runner.kv_cache.dtype == FP8 and ref_runner.kv_cache.dtype == torch.float32
    assert runner.block_bytes * 4 == ref_runner.block_bytes
    assert [len(t) for t in out] == [8, 8]
    assert runner.kv_cache.float().abs().sum() > 0  # the prompts' k/v were stored


@pytest.mark.parametrize("block_n", [16, 32])
def test_decode_over_fp8_cache_at_each_tile_width(block_n):
    """Both tile widths over an fp8 cache (the sweep's block_n) and bf16 q, which the kernel widens
    to fp16 for tl.dot on the GPU, against the torch reference."""

    gen = torch.Generator().manual_seed(4)
    num_blocks, block_size, hq, hkv, d = 10, 32, 4, 2, 32
    assert decode_rules.choose_block_n(256) == 64 and decode_rules.choose_block_n(16) == 16
    k_cache, v_cache = fp8_cache(num_blocks, block_size, hkv, d, gen)
    ctx_lens = [1, 70, 33, 96]
    tables = make_block_tables(ctx_lens, block_size, num_blocks, gen)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    q = torch.randn(4, hq, d, generator=gen).bfloat16()
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, d**-0.5, 2, K_SCALE, V_SCALE, block_n=block_n
    )
    cu = torch.arange(5, dtype=torch.int32)
    ref = paged_attention_torch(
        q.float(), k_cache, v_cache, tables, cu, lens, d**-0.5, K_SCALE, V_SCALE
    )
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 2e-2
    for bad in (8, 24, 64):  # under 16, not a power of two, past the block
        with pytest.raises(ValueError, match="block_n"):
            kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5, block_n=bad)
