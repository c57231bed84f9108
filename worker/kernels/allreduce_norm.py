"""All-reduce of a row-parallel layer's partial sums fused with the residual add and RMSNorm that
follow it (worker.distributed.all_reduce_add_rms_norm, tensor parallelism on CUDA).

One program per token row: it writes its row of this rank's partial sum into every peer's symmetric
buffer (a push over NVLink: no remote read's round trip), raises a flag on each peer, waits for every
peer's flag on this rank, sums the rows of all ranks in rank order from local memory (every rank gets
the same bits), then adds the residual and normalises as worker.kernels.norm does. One launch instead
of an all-reduce kernel and a norm kernel.
Two slots suffice: a rank starts call j+2 only once its call j+1 has met every peer's flags, so every
peer has started call j+1 and thus finished call j, the last reader of the slot that j+2 overwrites.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _allreduce_add_rms_norm_kernel(
    x_ptr,  # (M, hidden): this rank's partial sum
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    buffer_ptrs,  # (world,) int64: each rank's symmetric buffer, (2 slots, world sources, section)
    signal_ptrs,  # (world,) int64: each rank's symmetric int32 signal flags, (max_rows, world)
    slot_offset,  # elements: the slot this call uses (consecutive calls alternate slots)
    section,  # elements: one source rank's part of a slot
    rank,
    hidden,
    eps,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    offs = row.to(tl.int64) * hidden + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    mine = slot_offset + rank * section + offs  # where this rank's row goes on every peer
    if WORLD > 1:
        for peer in tl.static_range(WORLD):
            if peer != rank:
                buf = tl.load(buffer_ptrs + peer).to(tl.pointer_type(tl.bfloat16))
                tl.store(buf + mine, x, mask=mask)
        # all threads' stores are ordered before the flag by the CTA barrier and the release
        # (system scope: the peers are other GPUs)
        tl.debug_barrier()
        for peer in tl.static_range(WORLD):
            if peer != rank:
                flags = tl.load(signal_ptrs + peer).to(tl.pointer_type(tl.int32))
                # spins only while the peer has not yet consumed this row's previous flag
                while tl.atomic_cas(flags + row * WORLD + rank, 0, 1, sem="release", scope="sys") != 0:
                    pass
        flags = tl.load(signal_ptrs + rank).to(tl.pointer_type(tl.int32))
        for peer in tl.static_range(WORLD):
            if peer != rank:
                # wait for the peer's flag and reset it: the pad is clean for the next call
                while tl.atomic_cas(flags + row * WORLD + peer, 1, 0, sem="acquire", scope="sys") != 1:
                    pass
        tl.debug_barrier()
    own = tl.load(buffer_ptrs + rank).to(tl.pointer_type(tl.bfloat16))
    acc = tl.zeros((BLOCK,), tl.float32)
    for src in tl.static_range(WORLD):  # rank order: the same sum on every rank
        if src == rank:
            acc += x.to(tl.float32)
        else:
            part = own + slot_offset + src * section + offs
            acc += tl.load(part, mask=mask, other=0.0, volatile=True).to(tl.float32)
    # the all-reduced partial is rounded to bf16 like an unfused all-reduce's output
    h = acc.to(tl.bfloat16).to(tl.float32) + tl.load(residual_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(new_residual_ptr + offs, h.to(tl.bfloat16), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (h * rstd).to(tl.bfloat16).to(tl.float32) * w
    tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)


def allreduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, buffer_ptrs: torch.Tensor, signal_ptrs: torch.Tensor,
                           slot: int, section: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (M, hidden) bf16, contiguous; x is this rank's partial sum. Returns
    (rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual). Each rank's buffer holds
    2 slots of world sections of `section` elements. The caller checks that M rows fit the
    sections and the flags, and alternates the slot (0, 1) between consecutive calls."""
    m, hidden = x.shape
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    if m:
        block = triton.next_power_of_2(hidden)
        _allreduce_add_rms_norm_kernel[(m,)](
            x, residual, weight, out, new_residual, buffer_ptrs, signal_ptrs,
            slot * buffer_ptrs.numel() * section, section, rank, hidden, eps,
            WORLD=buffer_ptrs.numel(), BLOCK=block,
            num_warps=min(max(block // 256, 1), 8))
    return out, new_residual
