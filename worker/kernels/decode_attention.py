"""Decode attention over the paged KV cache (Attention.forward, decode step): one new token a sequence.

Flash-decoding: grid (batch, num_kv_heads, num_splits). Each program packs all q heads of one kv head
into M (padded to 16 rows for tl.dot), so K/V are read once per kv head, and covers one share of its
sequence's context; the last program of a (sequence, kv head) to finish merges the shares by
log-sum-exp in the same launch (an arrival counter). The grid depends on shapes only and nothing syncs
with the host, so a captured CUDA graph replays it for any context lengths.
"""

import functools

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.dtypes import dot_dtype

LOG2E = 1.4426950408889634
MAX_SPLITS = 16

# device -> arrival-counter buffers, the newest last. int32, all zero between launches (the merging
# program resets its counter). Older buffers stay alive: a CUDA graph captured with one replays it.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


# stride_bt: the block-table width, per step on the eager path (the graphs fix it); not specialised
# so that a new width compiles nothing
@triton.jit(do_not_specialize=["stride_bt"])
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
    qk_scale,
    v_scale,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    # Shares are cut from this sequence's own length (a multiple of BLOCK_N each) so every
    # split has work
    # even when block_tables is padded far past it (CUDA graphs size it for max_model_len).
    split_len = tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, context_len)

    rows = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None],
        other=0.0,
    ).to(DOT_DTYPE)  # (BLOCK_H, HEAD_DIM)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_off = kv_head * stride_ch
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
    if NUM_SPLITS == 1:
        tl.store(
            o_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=row_mask[:, None],
        )
    else:
        # partials: (batch, num_q_heads, NUM_SPLITS, HEAD_DIM) fp32 and lse (batch,
        # num_q_heads, NUM_SPLITS)
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        rows_base = (seq * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS  # (BLOCK_H,)
        tl.store(part_lse_ptr + rows_base + split, lse, mask=row_mask)
        tl.store(
            part_o_ptr + (rows_base + split)[:, None] * HEAD_DIM + dims[None, :],
            out,
            mask=row_mask[:, None],
        )
        # Arrival: every thread's partial stores precede the barrier, the barrier precedes the
        # (single-thread) gpu-scope release of the counter add, so a program that acquires the
        # count sees them. The last of the NUM_SPLITS programs of this (seq, kv_head) merges.
        tl.debug_barrier()
        counter = counters_ptr + seq * tl.num_programs(1) + kv_head
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == NUM_SPLITS - 1:
            # ".cg" reads at L2: the other programs' partials may be stale in this SM's L1
            splits = tl.arange(0, BLOCK_S)
            lse_all = tl.load(
                part_lse_ptr + rows_base[:, None] + splits[None, :],
                mask=row_mask[:, None] & (splits < NUM_SPLITS)[None, :],
                other=float("-inf"),
                cache_modifier=".cg",
            )  # (BLOCK_H, BLOCK_S)
            # context_len 0 (a padded batch entry) leaves every split empty: zeros, not NaN
            m = tl.max(lse_all, 1)
            m = tl.where(m > float("-inf"), m, 0.0)
            total = tl.sum(tl.where(lse_all > float("-inf"), tl.exp2(lse_all - m[:, None]), 0.0), 1)
            merged = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
            for j in tl.static_range(NUM_SPLITS):
                lse_j = tl.load(
                    part_lse_ptr + rows_base + j,
                    mask=row_mask,
                    other=float("-inf"),
                    cache_modifier=".cg",
                )
                w = tl.where(lse_j > float("-inf"), tl.exp2(lse_j - m), 0.0)
                part = tl.load(
                    part_o_ptr + (rows_base + j)[:, None] * HEAD_DIM + dims[None, :],
                    mask=row_mask[:, None],
                    other=0.0,
                    cache_modifier=".cg",
                )  # (BLOCK_H, HEAD_DIM)
                merged += part * w[:, None]
            merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
            tl.store(
                o_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                merged.to(o_ptr.dtype.element_ty),
                mask=row_mask[:, None],
            )
            # every split of this launch has arrived: zero for the next launch / graph replay
            tl.store(counter, 0)


def _arrival_counters(device: torch.device, size: int) -> torch.Tensor:
    """A zeroed int32 buffer of >= size counters that persists across calls and graph replays.

    Grows only outside CUDA-graph capture (an allocation there would belong to the graph's pool
    and be reused by other tensors between replays); the engine's eager warm-up of each bucket before
    capturing it, largest first, sizes it in time.
    """
    buffers = _COUNTERS.setdefault(device, [])
    if buffers and buffers[-1].numel() >= size:
        return buffers[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        have = buffers[-1].numel() if buffers else 0
        raise RuntimeError(
            f"paged_decode_attention: capturing a CUDA graph needs {size} arrival counters on "
            f"{device} but only {have} exist; run the same decode shape eagerly before capture"
        )
    buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits per (sequence, kv head), from shapes only.

    Rule: aim for ~2 programs per SM (H200: 132 SMs -> 264 programs); a (batch * num_kv_heads) grid that
    already reaches that gets 1 split (no partials, no merge). Otherwise split up to MAX_SPLITS,
    keeping >= 256 tokens of the longest possible context (max_blocks * block_size) per split so the
    merge stays cheap against the K/V reads.
    """
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    programs = batch * num_kv_heads
    if programs >= 2 * sms:
        return 1
    splits = triton.cdiv(2 * sms, programs)
    return max(1, min(splits, MAX_SPLITS, triton.cdiv(max_context, 256)))


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
) -> torch.Tensor:
    """q: (batch, num_q_heads, head_dim) -> o of the same shape; context_lens (batch,) counts the new
    token. k_scale, v_scale: the cache holds k / k_scale and v / v_scale (fp8; 1.0 otherwise)."""
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
    group = num_q_heads // num_kv_heads
    if num_splits is None:
        num_splits = choose_num_splits(
            batch, num_kv_heads, block_tables.shape[1] * block_size, q.device
        )
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return o
    if num_splits > 1:
        part_o = torch.empty(
            batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        # one arrival counter per (seq, kv_head), (batch, num_kv_heads) row-major
        counters = _arrival_counters(q.device, batch * num_kv_heads)
    else:
        part_o = part_lse = o  # unused by the NUM_SPLITS == 1 specialisation
        counters = context_lens
    fp32 = q.dtype == torch.float32
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
        scale * LOG2E * k_scale,
        v_scale,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=min(64, block_size),
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        DOT_PRECISION="ieee" if fp32 else "tf32",
        DOT_DTYPE=dot_dtype(k_cache.dtype, q.dtype),
        num_warps=4,
        num_stages=2 if fp32 else 3,
    )
    return o
