"""Decode attention over the paged KV cache (Attention.forward, decode step): one new token a sequence.

Flash-decoding: grid (batch, num_kv_heads, num_splits). Each program packs all q heads of one kv head
into M (padded to 16 rows for tl.dot), so K/V are read once per kv head, and covers one share of its
sequence's context: at least min_split_len tokens, so a short sequence uses fewer programs than a long
one and a batch of mixed lengths is cut into shares of similar size (no one long sequence sets the
kernel's time). The last program of a (sequence, kv head) to finish merges its shares by log-sum-exp
in the same launch (an arrival counter). The grid depends on shapes only and nothing syncs with the
host, so a captured CUDA graph replays it for any context lengths. Given the step's raw q, k and v
(NewTokens), it also does qk_norm_rope's work: q/k RMSNorm and rotary, and the new k/v's store.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels import decode_rules
from nanoserve.worker.kernels.arrival import arrival_counters
from nanoserve.worker.kernels.decode_merge import merge_shares
from nanoserve.worker.kernels.dtypes import dot_dtype
from nanoserve.worker.kernels.pdl import pdl_launch, pdl_wait
from nanoserve.worker.kernels.qk_norm_rope import norm_rope_rows

LOG2E = 1.4426950408889634


class NewTokens(NamedTuple):
    """A decode step's raw k and v (batch, num_kv_heads, head_dim), strided views of the qkv
    projection as q is, and what qk_norm_rope would take: the attention normalises and rotates q
    and k itself and stores k and v at slot_mapping (-1: nothing) before it reads the cache."""

    k: torch.Tensor
    v: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos_sin: torch.Tensor  # (max_position, head_dim) fp32 as [cos | sin]
    positions: torch.Tensor  # (batch,)
    slot_mapping: torch.Tensor  # (batch,)
    eps: float


# stride_bt: the block-table width, per step on the eager path (the graphs fix it); not specialised
# so that a new width compiles nothing. positions and slot_mapping: views of a step's flat input
# message (qk_norm_rope's comment): their alignment is not specialised on either.
@triton.jit(do_not_specialize=["stride_bt"], do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    counters_ptr,
    k_new_ptr,
    v_new_ptr,
    qw_ptr,
    kw_ptr,
    cos_sin_ptr,
    pos_ptr,
    slot_ptr,
    qk_scale,
    k_scale,
    v_scale,
    eps,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    NORM_ROPE: tl.constexpr,  # q, k_new, v_new raw (NewTokens): normalise, rotate, store here
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MIN_SPLIT: tl.constexpr,  # tokens, a multiple of BLOCK_N
    BLOCK_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PDL: tl.constexpr,  # worker.kernels.pdl: wait for the previous kernel first
):
    pdl_wait(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    # Shares are cut from this sequence's own length, so every active split has work even when
    # block_tables is padded far past it (CUDA graphs size it for max_model_len): as many shares as
    # whole MIN_SPLITs fit, at most NUM_SPLITS (rounded down: 1,025 tokens at 512 are two shares of
    # ~512, not 512 + 512 + 1), each whole BLOCK_N tiles and never empty of tiles (a padded entry,
    # length 0, has one share that reads nothing). Splits past the last share do nothing and take
    # no part in the merge; one share stores its output directly.
    shares = tl.minimum(tl.maximum(context_len // MIN_SPLIT, 1), NUM_SPLITS)
    split_len = tl.maximum(tl.cdiv(tl.cdiv(context_len, shares), BLOCK_N) * BLOCK_N, BLOCK_N)
    active = tl.maximum(tl.cdiv(context_len, split_len), 1)
    start = split * split_len
    end = tl.minimum(start + split_len, context_len)
    if split < active:
        rows = tl.arange(0, BLOCK_H)
        dims = tl.arange(0, HEAD_DIM)
        cols = tl.arange(0, BLOCK_N)
        row_mask = rows < GROUP
        heads = kv_head * GROUP + rows
        q_rows = q_ptr + seq * stride_qb + heads[:, None] * stride_qh
        kv_head_off = kv_head * stride_ch
        if NORM_ROPE:  # q (and the new k) normalised and rotated here, as qk_norm_rope does
            dtype = q_ptr.dtype.element_ty
            position = tl.load(pos_ptr + seq).to(tl.int64)  # (not pos: the loop's)
            q = norm_rope_rows(
                q_rows, row_mask[:, None], qw_ptr, cos_sin_ptr, position, eps, HEAD_DIM, dtype
            )
            q = q.to(DOT_DTYPE)  # (BLOCK_H, HEAD_DIM)
            # the share holding the new token (the last) stores its k and v first; the barrier
            # makes the stores visible to every thread's loads of the tiles below
            if split == active - 1:
                slot = tl.load(slot_ptr + seq).to(tl.int64)
                if slot >= 0:
                    one = tl.arange(0, 1)[:, None]  # (1, 1): the kv head's row
                    k_row = k_new_ptr + seq * stride_kb + kv_head * stride_kh + one
                    k_new = norm_rope_rows(
                        k_row, one < 1, kw_ptr, cos_sin_ptr, position, eps, HEAD_DIM, dtype
                    )
                    v_new = tl.load(
                        v_new_ptr + seq * stride_vb + kv_head * stride_vh + one + dims[None, :]
                    )
                    # the cache holds k / k_scale, v / v_scale (fp8; scales of 1.0 change no bit)
                    dst = (
                        (slot // BLOCK_SIZE) * stride_cb
                        + (slot % BLOCK_SIZE) * stride_cs
                        + kv_head_off
                    )
                    dst = dst + one + dims[None, :]
                    cache_dtype = k_cache_ptr.dtype.element_ty
                    tl.store(k_cache_ptr + dst, (k_new.to(tl.float32) / k_scale).to(cache_dtype))
                    tl.store(v_cache_ptr + dst, (v_new.to(tl.float32) / v_scale).to(cache_dtype))
                tl.debug_barrier()
        else:
            q = tl.load(q_rows + dims[None, :], mask=row_mask[:, None], other=0.0).to(
                DOT_DTYPE
            )  # (BLOCK_H, HEAD_DIM)

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for tile in range(start, end, BLOCK_N):
            # BLOCK_N divides BLOCK_SIZE and tiles start at multiples of BLOCK_N: a tile lies
            # in one block
            block = tl.load(table + tile // BLOCK_SIZE).to(tl.int64)
            pos = tile + cols
            valid = pos < end
            kv_off = (
                block * stride_cb
                + kv_head_off
                + ((tile % BLOCK_SIZE) + cols)[:, None] * stride_cs
                + dims[None, :]
            )
            # (BLOCK_N, HEAD_DIM); masked rows may hold stale NaN/inf of another sequence and
            # must not reach p @ v
            k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(DOT_DTYPE)
            v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(DOT_DTYPE)
            s = (
                tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            )  # (BLOCK_H, BLOCK_N), log2 units
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
            m_i = m_new

        nonempty = l_i > 0.0
        out = acc / tl.where(nonempty, l_i, 1.0)[:, None] * v_scale
        # one share (always, or for this sequence): the output directly, no partials
        direct = (active == 1) | (NUM_SPLITS == 1)
        if direct:
            tl.store(
                o_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                out.to(o_ptr.dtype.element_ty),
                mask=row_mask[:, None],
            )
        else:
            if NUM_SPLITS > 1:  # (static) partial buffers exist only then
                # partials: (batch, num_q_heads, NUM_SPLITS, HEAD_DIM) fp32 and lse (batch,
                # num_q_heads, NUM_SPLITS), one row of NUM_SPLITS a q head
                merge_shares(
                    out,
                    tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf")),
                    o_ptr + seq * stride_ob + heads[:, None] * stride_oh,
                    part_o_ptr,
                    part_lse_ptr,
                    counters_ptr + seq * tl.num_programs(1) + kv_head,
                    (seq * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS,
                    split,
                    active,
                    row_mask,
                    BLOCK_H,
                    HEAD_DIM,
                    NUM_SPLITS,
                    BLOCK_S,
                )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    min_split_len: int | None = None,
    block_n: int | None = None,
    config: dict | None = None,
    new: NewTokens | None = None,
) -> torch.Tensor:
    """q: (batch, num_q_heads, head_dim) -> o of the same shape; context_lens (batch,) counts the new
    token. new: q is raw and this step's k/v are not stored yet (NewTokens), the kernel does both. k_scale, v_scale: the cache holds k / k_scale and v / v_scale (fp8; 1.0 otherwise).
    num_splits / min_split_len: at most this many shares a sequence, each at least this many
    tokens (rounded up to the tile); None: the shape rules above. block_n: tokens a tile, a power
    of two dividing the block size, and config: num_warps / num_stages (None: choose_tiles)."""
    batch, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit k_cache {tuple(k_cache.shape)}")
    if block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError("block_tables and context_lens need one row per sequence in q")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError(
            "paged_decode_attention needs contiguous head_dim and identical k/v cache strides"
        )
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if min_split_len is not None and min_split_len < 1:
        raise ValueError(f"min_split_len must be >= 1, got {min_split_len}")
    group = num_q_heads // num_kv_heads
    if num_splits is None:
        num_splits = decode_rules.choose_num_splits(
            batch, num_kv_heads, block_tables.shape[1] * block_size, q.device
        )
    rule_n, rule_config = decode_rules.choose_tiles(batch, block_size, k_cache.dtype)
    if block_n is None:
        block_n = rule_n
    if block_n < 16 or block_n & (block_n - 1) or block_size % block_n:
        raise ValueError(
            f"block_n must be a power of two >= 16 dividing {block_size}, got {block_n}"
        )
    if min_split_len is None:
        min_split_len = decode_rules.choose_split_len(batch, num_kv_heads, q.device)
    min_split_len = triton.cdiv(min_split_len, block_n) * block_n
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return o
    if num_splits > 1:
        part_o = torch.empty(
            batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        # one arrival counter per (seq, kv_head), (batch, num_kv_heads) row-major
        counters = arrival_counters(q.device, batch * num_kv_heads, "paged_decode_attention")
    else:
        part_o = part_lse = o  # unused by the NUM_SPLITS == 1 specialisation
        counters = context_lens
    fp32 = q.dtype == torch.float32
    c = rule_config | (config or {})
    if new is not None:
        if new.k.shape != (batch, num_kv_heads, head_dim) or new.v.shape != new.k.shape:
            raise ValueError(f"new k/v {tuple(new.k.shape)} do not fit q {tuple(q.shape)}")
        if new.k.stride(-1) != 1 or new.v.stride(-1) != 1 or head_dim % 2:
            raise ValueError("new k/v need a contiguous, even head_dim")
        if new.positions.shape != (batch,) or new.slot_mapping.shape != (batch,):
            raise ValueError("new positions and slot_mapping need one entry per sequence")
        raw = new
    else:  # unused by the NORM_ROPE=False specialisation
        raw = NewTokens(q, q, q, q, q, context_lens, context_lens, 0.0)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        o,
        part_o,
        part_lse,
        counters,
        raw.k,
        raw.v,
        raw.q_weight,
        raw.k_weight,
        raw.cos_sin,
        raw.positions,
        raw.slot_mapping,
        scale * LOG2E * k_scale,
        k_scale,
        v_scale,
        raw.eps,
        q.stride(0),
        q.stride(1),
        raw.k.stride(0),
        raw.k.stride(1),
        raw.v.stride(0),
        raw.v.stride(1),
        o.stride(0),
        o.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        NORM_ROPE=new is not None,
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        MIN_SPLIT=min_split_len,
        BLOCK_S=triton.next_power_of_2(num_splits),
        DOT_PRECISION="ieee" if fp32 else "tf32",
        DOT_DTYPE=dot_dtype(k_cache.dtype, q.dtype),
        num_warps=c["num_warps"],
        num_stages=c["num_stages"],
        **pdl_launch(q),
    )
    return o
