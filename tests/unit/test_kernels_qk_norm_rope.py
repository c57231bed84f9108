"""The fused q/k RMSNorm + rotary kernel (Triton interpreter on CPU) equals the torch layers."""

import pytest
import torch

from nanoserve.worker.kernels import qk_norm_rope
from nanoserve.worker.layers.layernorm import RMSNorm
from nanoserve.worker.layers.rotary_embedding import RotaryEmbedding


@pytest.mark.parametrize("rows", [1, 4, 16])  # tokens a program: 7 tokens leave a partial tile
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (2, 2, 16)])
def test_matches_torch_layers(dtype, tol, hq, hkv, d, rows):
    torch.manual_seed(0)
    n = 7
    qkv = torch.randn(n, (hq + 2 * hkv) * d).to(dtype)
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.1 * torch.randn(d))
        k_norm.weight.copy_(1 + 0.1 * torch.randn(d))
    q_norm, k_norm = q_norm.to(dtype), k_norm.to(dtype)
    rope = RotaryEmbedding(d, 512, 10000.0)
    positions = torch.tensor([0, 1, 5, 100, 511, 3, 3])
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(n, hq, d), k.view(n, hkv, d)
    with torch.no_grad():
        ref_q, ref_k = rope(positions, q_norm(q.clone()), k_norm(k.clone()))
    v_before = qkv[:, (hq + hkv) * d :].clone()
    qk_norm_rope(
        q,
        k,
        q_norm.weight.data,
        k_norm.weight.data,
        rope.cache_on(torch.device("cpu")),
        positions,
        1e-6,
        rows_per_program=rows,
    )  # in place on the views of qkv
    assert torch.allclose(q.float(), ref_q.float(), atol=tol, rtol=tol)
    assert torch.allclose(k.float(), ref_k.float(), atol=tol, rtol=tol)
    assert torch.equal(qkv[:, (hq + hkv) * d :], v_before)  # v untouched


def _qkv_case(dtype, n: int, hq: int, hkv: int, d: int, num_blocks: int, block_size: int):
    gen = torch.Generator().manual_seed(n + hq + d)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q_w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    k_w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    cache_shape = (num_blocks, block_size, hkv, d)
    k_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    return qkv, q_w, k_w, k_cache, v_cache


def _views(qkv: torch.Tensor, hq: int, hkv: int, d: int):
    # (N, Hq, D), (N, Hkv, D), (N, Hkv, D): strided views of the fused qkv rows
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    n = qkv.shape[0]
    return q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_store_equals_norm_rope_then_store_kvcache(dtype, slot_dtype, rows):
    from nanoserve.worker.kernels import store_kvcache

    n, hq, hkv, d, num_blocks, block_size = 6, 4, 2, 32, 5, 16
    qkv, q_w, k_w, k_cache, v_cache = _qkv_case(dtype, n, hq, hkv, d, num_blocks, block_size)
    cos_sin = RotaryEmbedding(d, 512, 10000.0).cache_on(torch.device("cpu"))
    positions = torch.tensor([0, 7, 15, 16, 300, 2])
    # slot -1: a CUDA-graph padding row; others cross block boundaries, in shuffled blocks
    slots = torch.tensor([33, -1, 15, 16, 79, 2], dtype=slot_dtype)

    ref_qkv, ref_k_cache, ref_v_cache = qkv.clone(), k_cache.clone(), v_cache.clone()
    ref_q, ref_k, ref_v = _views(ref_qkv, hq, hkv, d)
    qk_norm_rope(ref_q, ref_k, q_w, k_w, cos_sin, positions, 1e-6)
    store_kvcache(ref_k, ref_v, ref_k_cache, ref_v_cache, slots)

    q, k, v = _views(qkv, hq, hkv, d)
    qk_norm_rope(
        q,
        k,
        q_w,
        k_w,
        cos_sin,
        positions,
        1e-6,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slots,
        rows_per_program=rows,
    )
    assert torch.equal(qkv, ref_qkv)  # q, k normed + rotated in place (the padded row too), v kept
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache)
    stored = k_cache.view(-1, hkv, d)
    assert torch.equal(stored[slots[0]], k[0]) and torch.equal(v_cache.view(-1, hkv, d)[79], v[4])


def test_fused_store_skips_padded_slots_and_leaves_other_slots_untouched():
    n, hq, hkv, d, num_blocks, block_size = 4, 2, 2, 16, 3, 16
    qkv, q_w, k_w, k_cache, v_cache = _qkv_case(
        torch.float32, n, hq, hkv, d, num_blocks, block_size
    )
    cos_sin = RotaryEmbedding(d, 64, 10000.0).cache_on(torch.device("cpu"))
    positions = torch.tensor([3, 4, 5, 6])
    slots = torch.tensor([-1, 20, -1, -1], dtype=torch.int32)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    ref_q, ref_k, _ = _views(qkv.clone(), hq, hkv, d)
    qk_norm_rope(ref_q, ref_k, q_w, k_w, cos_sin, positions, 1e-6)

    q, k, v = _views(qkv, hq, hkv, d)
    qk_norm_rope(
        q,
        k,
        q_w,
        k_w,
        cos_sin,
        positions,
        1e-6,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slots,
    )
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)  # padded rows still normed in place
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    assert torch.equal(flat_k[20], k[1]) and torch.equal(flat_v[20], v[1])
    others = torch.arange(num_blocks * block_size) != 20
    assert torch.equal(flat_k[others], before_k.view(-1, hkv, d)[others])
    assert torch.equal(flat_v[others], before_v.view(-1, hkv, d)[others])


def test_fused_store_needs_all_of_v_caches_and_slots():
    q, k = torch.zeros(2, 2, 16), torch.zeros(2, 1, 16)
    cos_sin = RotaryEmbedding(16, 8, 10000.0).cache_on(torch.device("cpu"))
    with pytest.raises(ValueError, match="come together"):
        qk_norm_rope(
            q,
            k,
            torch.ones(16),
            torch.ones(16),
            cos_sin,
            torch.zeros(2, dtype=torch.long),
            1e-6,
            v=k.clone(),
            slot_mapping=torch.zeros(2, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="slot_mapping"):
        qk_norm_rope(
            q,
            k,
            torch.ones(16),
            torch.ones(16),
            cos_sin,
            torch.zeros(2, dtype=torch.long),
            1e-6,
            v=k.clone(),
            k_cache=torch.zeros(1, 16, 1, 16),
            v_cache=torch.zeros(1, 16, 1, 16),
            slot_mapping=torch.zeros(3),
        )
