"""The end of a decode-attention program that covered one share of its sequence (decode_attention):
store the share's partial output and log-sum-exp, and, if it is the last share of its (sequence,
kv head) to arrive (an arrival counter, worker.kernels.arrival), merge them all into the output.
"""

import triton
import triton.language as tl


@triton.jit
def merge_shares(
    out,
    lse,
    o_rows,
    part_o_ptr,
    part_lse_ptr,
    counter,
    rows_base,
    split,
    active,
    row_mask,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """out (BLOCK_H, HEAD_DIM) fp32 and lse (BLOCK_H,) of share `split` of `active`; o_rows
    (BLOCK_H, 1): each q head's output row; rows_base (BLOCK_H,): each q head's first partial;
    counter: this (sequence, kv head)'s arrival counter."""
    dims = tl.arange(0, HEAD_DIM)
    tl.store(part_lse_ptr + rows_base + split, lse, mask=row_mask)
    tl.store(
        part_o_ptr + (rows_base + split)[:, None] * HEAD_DIM + dims[None, :],
        out,
        mask=row_mask[:, None],
    )
    # Arrival: every thread's partial stores precede the barrier, the barrier precedes the
    # (single-thread) gpu-scope release of the counter add, so a program that acquires the
    # count sees them. The last of the `active` programs of this (seq, kv_head) merges.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == active - 1:
        # ".cg" reads at L2: the other programs' partials may be stale in this SM's L1
        splits = tl.arange(0, BLOCK_S)
        lse_all = tl.load(
            part_lse_ptr + rows_base[:, None] + splits[None, :],
            mask=row_mask[:, None] & (splits < active)[None, :],
            other=float("-inf"),
            cache_modifier=".cg",
        )  # (BLOCK_H, BLOCK_S)
        m = tl.max(lse_all, 1)
        m = tl.where(m > float("-inf"), m, 0.0)
        total = tl.sum(tl.where(lse_all > float("-inf"), tl.exp2(lse_all - m[:, None]), 0.0), 1)
        merged = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        for j in tl.static_range(NUM_SPLITS):
            lse_j = tl.load(
                part_lse_ptr + rows_base + j,
                mask=row_mask & (j < active),
                other=float("-inf"),
                cache_modifier=".cg",
            )
            w = tl.where(lse_j > float("-inf"), tl.exp2(lse_j - m), 0.0)
            part = tl.load(
                part_o_ptr + (rows_base + j)[:, None] * HEAD_DIM + dims[None, :],
                mask=row_mask[:, None] & (j < active),
                other=0.0,
                cache_modifier=".cg",
            )  # (BLOCK_H, HEAD_DIM)
            merged += part * w[:, None]
        merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
        tl.store(o_rows + dims[None, :], merged.to(o_rows.dtype.element_ty), mask=row_mask[:, None])
        # every split of this launch has arrived: zero for the next launch / graph replay
        tl.store(counter, 0)
