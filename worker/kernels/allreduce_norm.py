"""All-reduce of a row-parallel layer's partial sums fused with the residual add and RMSNorm that
follow it (worker.distributed.all_reduce_add_rms_norm, tensor parallelism on CUDA).

One program per token row: it copies its row of this rank's partial sum into this rank's slot of a
symmetric buffer, meets the same program on every peer at a barrier of signal flags, sums the rows of
all ranks in rank order (every rank gets the same bits), then adds the residual and normalises as
worker.kernels.norm does. One launch instead of an all-reduce kernel and a norm kernel.
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
    buffer_ptrs,  # (world,) int64: each rank's symmetric data buffer
    signal_ptrs,  # (world,) int64: each rank's symmetric int32 signal flags, (max_rows, world)
    slot_offset,  # elements: the data slot this call uses (calls alternate slots)
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
    own = tl.load(buffer_ptrs + rank).to(tl.pointer_type(tl.bfloat16))
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(own + slot_offset + offs, x, mask=mask)
    if WORLD > 1:
        # barrier of this row's program on every rank: all threads' stores above are ordered
        # before the flag by the CTA barrier and the release (system scope: peers read over NVLink)
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
    acc = tl.zeros((BLOCK,), tl.float32)
    for peer in tl.static_range(WORLD):  # rank order: the same sum on every rank
        buf = tl.load(buffer_ptrs + peer).to(tl.pointer_type(tl.bfloat16))
        acc += tl.load(buf + slot_offset + offs, mask=mask, other=0.0, volatile=True).to(tl.float32)
    # the all-reduced partial is rounded to bf16 like an unfused all-reduce's output
    h = acc.to(tl.bfloat16).to(tl.float32) + tl.load(residual_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(new_residual_ptr + offs, h.to(tl.bfloat16), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (h * rstd).to(tl.bfloat16).to(tl.float32) * w
    tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)


def allreduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, buffer_ptrs: torch.Tensor, signal_ptrs: torch.Tensor,
                           slot_offset: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (M, hidden) bf16, contiguous; x is this rank's partial sum. Returns
    (rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual). The caller checks that
    M rows fit the buffers and the flags, and alternates slot_offset between consecutive calls."""
    m, hidden = x.shape
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    if m:
        block = triton.next_power_of_2(hidden)
        _allreduce_add_rms_norm_kernel[(m,)](
            x, residual, weight, out, new_residual, buffer_ptrs, signal_ptrs, slot_offset, rank,
            hidden, eps, WORLD=buffer_ptrs.numel(), BLOCK=block,
            num_warps=min(max(block // 256, 1), 8))
    return out, new_residual
