"""The decode attention given a step's raw q, k, v (decode_attention.NewTokens) equals qk_norm_rope
(with its store) followed by the attention over the stored cache, bit for bit: the same q, the same
k and v in the cache, the same output. On CPU by the Triton interpreter."""

import pytest
import torch

from nanoserve.worker.layers.rotary_embedding import RotaryEmbedding
from tests.unit.interpreted_kernels import (
    decode_module,
    kernels,
    make_block_tables,
    make_cache,
)

BLOCK = 16


def _case(dtype, lens: list[int], group: int, hkv: int = 2, d: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = len(lens)
    hq = group * hkv
    qkv = (3 * torch.randn(n, (hq + 2 * hkv) * d, generator=gen)).to(dtype)
    q_w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    k_w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    k_cache, v_cache = make_cache(24, BLOCK, hkv, d, dtype, gen)
    tables = make_block_tables(lens, BLOCK, 24, gen, width=6)
    # the new token sits at position len - 1, in its sequence's block of that position; a
    # padded entry (length 0) has slot -1
    slots = torch.tensor(
        [int(tables[i, (m - 1) // BLOCK]) * BLOCK + (m - 1) % BLOCK if m else -1
         for i, m in enumerate(lens)]
    )  # fmt: skip
    positions = torch.tensor([max(m - 1, 0) for m in lens])
    return qkv, q_w, k_w, k_cache, v_cache, tables, slots, positions


def _views(qkv: torch.Tensor, hq: int, hkv: int, d: int):
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    n = qkv.shape[0]
    return q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_decode_equals_norm_rope_then_attention(dtype, group, num_splits):
    lens = [1, 16, 17, 40, 0, 70]  # block boundaries, several shares, a padded entry
    hkv, d = 2, 32
    qkv, q_w, k_w, k_cache, v_cache, tables, slots, positions = _case(dtype, lens, group, hkv, d)
    cos_sin = RotaryEmbedding(d, 512, 10000.0).cache_on(torch.device("cpu"))
    context_lens = torch.tensor(lens, dtype=torch.int32)

    ref_qkv, ref_k_cache, ref_v_cache = qkv.clone(), k_cache.clone(), v_cache.clone()
    q, k, v = _views(ref_qkv, group * hkv, hkv, d)
    kernels.qk_norm_rope(
        q, k, q_w, k_w, cos_sin, positions, 1e-6,
        v=v, k_cache=ref_k_cache, v_cache=ref_v_cache, slot_mapping=slots,
    )  # fmt: skip
    ref = kernels.paged_decode_attention(
        q, ref_k_cache, ref_v_cache, tables, context_lens, d**-0.5, num_splits=num_splits
    )

    raw_q, raw_k, raw_v = _views(qkv, group * hkv, hkv, d)
    new = decode_module().NewTokens(raw_k, raw_v, q_w, k_w, cos_sin, positions, slots, 1e-6)
    out = kernels.paged_decode_attention(
        raw_q, k_cache, v_cache, tables, context_lens, d**-0.5, num_splits=num_splits, new=new
    )
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache)
    live = context_lens > 0
    assert torch.equal(out[live], ref[live])
    # the raw views are left as they were (the kernel normalises in registers)
    assert torch.equal(qkv, _case(dtype, lens, group, hkv, d)[0])


def test_raw_decode_checks_its_inputs():
    qkv, q_w, k_w, k_cache, v_cache, tables, slots, positions = _case(torch.float32, [5, 9], 1)
    cos_sin = RotaryEmbedding(32, 512, 10000.0).cache_on(torch.device("cpu"))
    q, k, v = _views(qkv, 2, 2, 32)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    new = decode_module().NewTokens(k[:1], v[:1], q_w, k_w, cos_sin, positions, slots, 1e-6)
    with pytest.raises(ValueError, match="new k/v"):
        kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, new=new)
    new = new._replace(k=k, v=v, slot_mapping=slots[:1])
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, new=new)
