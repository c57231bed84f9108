"""Prefill / extend attention over the paged KV cache (Attention.forward when is_prefill).

q holds only the new tokens of each sequence (varlen by cu_seqlens_q); their k/v are already stored,
so every key, cached prefix or new, is read from the cache through block_tables. Each program owns
BLOCK_Q query tokens x all q heads of one kv head (the GQA group packed into M), runs an online
softmax, skips the mask on tiles every query sees and skips tiles past the causal edge. A program
finds its (sequence, query block) from cu_seqlens_q itself, so the grid follows only the token
count and the batch size: a prefill CUDA graph (worker.runner.prefill_graph) captures it.
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.dtypes import dot_dtype

LOG2E = 1.4426950408889634
# rows of a program's query tile (query tokens x the GQA group, at most), key tile, warps,
# pipeline stages, and the launch order of query blocks (HEAVY_FIRST: the causal edge's last
# blocks first). From benchmarks.attention's
# sweep_prefill_configs on the H200 (d0f1be3), one 16,384-token step of the throughput workload,
# Qwen3-0.6B heads: 203.9 µs a layer, against 233.5 for (128 rows, 64, 8 warps, 2 stages)
PREFILL_CONFIG: dict = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, HEAVY_FIRST=True)
SCAN = 64  # sequences of cu_seqlens_q a program reads at a time while finding its query block


# batch and stride_bt follow the step (its sequences, its longest sequence's blocks): integers
# Triton would otherwise specialise (== 1, % 16), compiling a new kernel mid-serving
@triton.jit(do_not_specialize=["batch", "stride_bt"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    o_ptr,
    qk_scale,
    v_scale,
    batch,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
    SCAN_SEQS: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP
    # program g owns the g-th (sequence, query block) pair of the step (the last first when
    # HEAVY_FIRST: a sequence's last blocks see the most keys, and launched first they end no
    # tail); the grid is an upper bound of the pairs, and programs past them exit. Sequences
    # [batch, ...) and empty ones own no block.
    g = tl.program_id(0)
    kv_head = tl.program_id(1)
    total = 0
    for start in range(0, batch, SCAN_SEQS):
        i = start + tl.arange(0, SCAN_SEQS)
        lo = tl.load(cu_seqlens_q_ptr + i, mask=i < batch, other=0)
        hi = tl.load(cu_seqlens_q_ptr + i + 1, mask=i < batch, other=0)
        total += tl.sum((hi - lo + BLOCK_Q - 1) // BLOCK_Q)
    idx = total - 1 - g if HEAVY_FIRST else g
    if (idx < 0) | (idx >= total):
        return
    # seq: the sequences whose blocks all come before idx; q_block: idx less their blocks
    seq = 0
    before = 0
    ends = 0  # blocks of the sequences before this chunk
    for start in range(0, batch, SCAN_SEQS):
        i = start + tl.arange(0, SCAN_SEQS)
        lo = tl.load(cu_seqlens_q_ptr + i, mask=i < batch, other=0)
        hi = tl.load(cu_seqlens_q_ptr + i + 1, mask=i < batch, other=0)
        blocks = (hi - lo + BLOCK_Q - 1) // BLOCK_Q
        done = (ends + tl.cumsum(blocks, 0) <= idx) & (i < batch)
        seq += tl.sum(done.to(tl.int32))
        before += tl.sum(tl.where(done, blocks, 0))
        ends += tl.sum(blocks)
    q_block = idx - before
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    context_len = tl.load(context_lens_ptr + seq)
    prefix_len = context_len - q_len  # query j sits at position prefix_len + j

    # row r of the tile = query token r // GROUP, q head kv_head * GROUP + r % GROUP
    rows = tl.arange(0, BLOCK_M)
    q_idx = q_block * BLOCK_Q + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_mask = q_idx < q_len
    q_pos = prefix_len + q_idx
    dims = tl.arange(0, HEAD_DIM)
    cols = tl.arange(0, BLOCK_N)
    tokens = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None],
        other=0.0,
    ).to(DOT_DTYPE)  # (BLOCK_M, HEAD_DIM)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table = block_tables_ptr + tl.cast(seq, tl.int64) * stride_bt
    kv_head_off = kv_head * stride_ch

    first_q_pos = prefix_len + q_block * BLOCK_Q
    last_q_pos = tl.minimum(first_q_pos + BLOCK_Q, context_len) - 1
    # keys [0, full_end) are visible to every query of the tile; [full_end, last_q_pos] need
    # the causal mask
    full_end = ((first_q_pos + 1) // BLOCK_N) * BLOCK_N
    for tile in range(0, full_end, BLOCK_N):
        block = tl.load(table + tile // BLOCK_SIZE).to(tl.int64)
        kv_off = (
            block * stride_cb
            + kv_head_off
            + ((tile % BLOCK_SIZE) + cols)[:, None] * stride_cs
            + dims[None, :]
        )
        k = tl.load(k_cache_ptr + kv_off).to(DOT_DTYPE)  # (BLOCK_N, HEAD_DIM)
        v = tl.load(v_cache_ptr + kv_off).to(DOT_DTYPE)
        s = (
            tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        )  # (BLOCK_M, BLOCK_N), log2 units
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    for tile in range(full_end, last_q_pos + 1, BLOCK_N):
        block = tl.load(table + tile // BLOCK_SIZE).to(tl.int64)
        pos = tile + cols
        valid = pos < context_len
        kv_off = (
            block * stride_cb
            + kv_head_off
            + ((tile % BLOCK_SIZE) + cols)[:, None] * stride_cs
            + dims[None, :]
        )
        k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        # every row sees key 0 or an earlier unmasked tile, so m_new stays finite
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None] * v_scale
    tl.store(
        o_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_mask[:, None],
    )


def prefill_block_q(num_tokens: int, group: int, fp32: bool, block_m: int | None = None) -> int:
    """Query tokens a program owns: block_m (PREFILL_CONFIG's) rows of M (at most 64 for fp32, to
    fit shared memory), at least one query token per row group, fewer for small steps. It follows
    the step's token count (its bucket when padded), not its sequences, so that a prefill graph
    and an eager step of one bucket run the same tiles. A constexpr: each value is a kernel, and
    ModelRunner's warm-up compiles every one that prefill_block_q_lengths reaches."""
    block_m = PREFILL_CONFIG["BLOCK_M"] if block_m is None else block_m
    block_q = max(1, min(block_m, 64 if fp32 else 128) // group)
    return min(block_q, max(16 // group, triton.next_power_of_2(num_tokens)))


def prefill_block_q_lengths(group: int, fp32: bool) -> list[int]:
    """One token count for each BLOCK_Q that prefill_block_q can return (the warm-up's lengths)."""
    top = prefill_block_q(1 << 30, group, fp32)
    seen: dict[int, int] = {}
    n = 1
    while n <= top:
        seen.setdefault(prefill_block_q(n, group, fp32), n)
        n *= 2
    return sorted(seen.values())


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    config: dict | None = None,
) -> torch.Tensor:
    """q: (num_tokens, num_q_heads, head_dim) new tokens -> o of the same shape (causal, bottom-right
    aligned), written into `out` when given. Rows past cu_seqlens_q[-1] (padding) are not written.
    k_scale, v_scale: the cache holds k / k_scale and v / v_scale (an fp8 cache; 1.0 otherwise).
    config: PREFILL_CONFIG's keys to override (benchmarks.attention's sweep)."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    batch = context_lens.shape[0]
    if cache_dim != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit k_cache {tuple(k_cache.shape)}")
    if cu_seqlens_q.shape != (batch + 1,) or block_tables.shape[0] != batch:
        raise ValueError(
            "cu_seqlens_q needs batch + 1 entries and block_tables one row per sequence"
        )
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError(
            "paged_prefill_attention needs contiguous head_dim and identical k/v cache strides"
        )
    group = num_q_heads // num_kv_heads
    if out is None:
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} does not fit q {tuple(q.shape)}")
    else:
        o = out
    if num_tokens == 0 or batch == 0:
        return o
    fp32 = q.dtype == torch.float32
    c = PREFILL_CONFIG | (config or {})
    block_q = prefill_block_q(num_tokens, group, fp32, c["BLOCK_M"])
    block_n = min(c["BLOCK_N"], block_size)
    # the step's (sequence, query block) pairs number at most one a token, and at most
    # num_tokens / block_q plus one partial block a sequence: shapes alone bound them
    grid = (min(num_tokens, triton.cdiv(num_tokens, block_q) + batch), num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        o,
        scale * LOG2E * k_scale,
        v_scale,
        batch,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if fp32 else "tf32",
        DOT_DTYPE=dot_dtype(k_cache.dtype, q.dtype),
        HEAVY_FIRST=c["HEAVY_FIRST"],
        SCAN_SEQS=SCAN,
        num_warps=c["num_warps"],
        num_stages=c["num_stages"],
    )
    return o
