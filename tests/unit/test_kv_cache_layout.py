"""The heads-major KV cache (worker.engine.kv_cache.HEADS_MAJOR): its strided views hold what the
token-major cache holds after the same stores (Triton kernels in the interpreter, the torch
reference), and the decode and prefill attention kernels read the same outputs from either."""

import pytest
import torch

from nanoserve.worker.engine.kv_cache import allocate_kv_cache
from nanoserve.worker.layers.attention import store_kvcache_torch
from tests.unit.interpreted_kernels import kernels, make_block_tables


class Layer:
    k_cache = v_cache = torch.empty(0)


def caches(
    heads_major: bool, num_blocks: int = 12, block_size: int = 16, hkv: int = 2, d: int = 32
):
    layers = [Layer()]
    kv = allocate_kv_cache(
        layers, num_blocks, block_size, (hkv, d), torch.float32, torch.device("cpu"), heads_major
    )
    return kv, layers[0].k_cache, layers[0].v_cache


def test_heads_major_views_are_strided_with_one_head_of_a_block_contiguous():
    kv, k, _ = caches(True)
    assert kv.shape == (2, 1, 12, 16, 2, 32) and k.shape == (12, 16, 2, 32)
    assert k.stride() == (16 * 2 * 32, 32, 16 * 32, 1)  # block, token, head, dim
    _, k_nhd, _ = caches(False)
    assert k_nhd.is_contiguous()


@pytest.mark.parametrize("store", ["triton", "torch"])
def test_same_stores_same_attention_in_either_layout(store):
    gen = torch.Generator().manual_seed(5)
    lens = [1, 17, 40, 70]
    hkv, d, group, bs = 2, 32, 2, 16
    tables = make_block_tables(lens, bs, 12, gen, width=5)
    outs = []
    for heads_major in (False, True):
        _, k_cache, v_cache = caches(heads_major)
        g = torch.Generator().manual_seed(9)
        # every token of each sequence into its slots, as prefill steps would store them
        slots = torch.cat(
            [
                tables[i, torch.arange(n) // bs] * bs + torch.arange(n) % bs
                for i, n in enumerate(lens)
            ]
        ).int()
        key = torch.randn(len(slots), hkv, d, generator=g)
        value = torch.randn(len(slots), hkv, d, generator=g)
        if store == "triton":
            kernels.store_kvcache(key, value, k_cache, v_cache, slots)
        else:
            store_kvcache_torch(key, value, k_cache, v_cache, slots)
        q = torch.randn(len(lens), group * hkv, d, generator=g)
        ctx = torch.tensor(lens, dtype=torch.int32)
        decode = kernels.paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.2, num_splits=2)
        outs.append((k_cache.contiguous(), v_cache.contiguous(), decode))
    (k0, v0, o0), (k1, v1, o1) = outs
    assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert torch.equal(o0, o1)
