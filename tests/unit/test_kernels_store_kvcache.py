"""kernels.store_kvcache against the torch reference (worker.layers.attention), run on CPU by the
Triton interpreter: strided key/value, padded slots skipped, mismatched shapes refused."""

import pytest
import torch

from nanoserve.worker.layers.attention import store_kvcache_torch
from tests.unit.interpreted_kernels import kernels, make_cache


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kvcache_matches_torch_and_skips_padded_slots(slot_dtype, dtype):
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, hkv, d = 6, 16, 2, 32
    k_cache, v_cache = make_cache(num_blocks, block_size, hkv, d, dtype, gen)
    # key/value as strided views into a fused qkv buffer, like the model's split of qkv_proj
    qkv = torch.randn(9, (4 + 2 * hkv) * d, generator=gen).to(dtype)
    key = qkv[:, 4 * d : (4 + hkv) * d].view(9, hkv, d)
    value = qkv[:, (4 + hkv) * d :].view(9, hkv, d)
    slots = torch.tensor([3, -1, 17, 40, -1, 95, 16, 15, -1], dtype=slot_dtype)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kvcache_torch(key, value, ref_k, ref_v, slots)
    kernels.store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_store_kvcache_all_padded_leaves_cache_untouched():
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = make_cache(4, 16, 4, 16, torch.float32, gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key = torch.randn(5, 4, 16, generator=gen)
    kernels.store_kvcache(
        key, key.clone(), k_cache, v_cache, torch.full((5,), -1, dtype=torch.int32)
    )
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_store_kvcache_rejects_mismatched_shapes():
    k_cache = torch.zeros(2, 16, 2, 16)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.store_kvcache(
            torch.zeros(3, 2, 16),
            torch.zeros(3, 2, 16),
            k_cache,
            k_cache.clone(),
            torch.zeros(4, dtype=torch.int32),
        )
