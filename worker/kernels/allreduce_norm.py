"""All-reduce of a row-parallel layer's partial sums fused with the residual add and RMSNorm that
follow it (worker.layers.distributed.all_reduce_add_rms_norm, tensor parallelism on CUDA).

One program per token row: it writes its row of this rank's partial sum into every peer's symmetric
buffer (a push over NVLink: no remote read's round trip), raises a flag on each peer, waits for every
peer's flag on this rank, sums the rows of all ranks in rank order from local memory (every rank gets
the same bits), then adds the residual and normalises as worker.kernels.norm does. One launch instead
of an all-reduce kernel and a norm kernel.
Two slots suffice: a rank starts call j+2 only once its call j+1 has met every peer's flags, so every
peer has started call j+1 and thus finished call j, the last reader of the slot that j+2 overwrites.

REQUIREMENT: on each rank these kernels run strictly one after another (one stream, no programmatic
dependent launch, no copy of the collective on a second stream): "finished call j" above is stream
order. The flag of a row carries the call's generation (a per-row counter on each rank, the same on
every rank since every rank runs the same calls with the same M), not 1, so a rank whose calls
overlap or whose peer runs another call finds a generation it did not expect: it writes an error
word and traps. Every spin is bounded (MAX_SPINS, tens of seconds): a peer that never arrives (dead,
stalled, another batch size) traps the kernel too, so the rank's process fails and is reported
dead instead of the GPU hanging forever. The error word is in pinned host memory (readable after
the trap, which ends the CUDA context): 1 = a peer never took my flag, 2 = a peer never arrived,
3 = a flag of another generation (calls out of order).
Needs Triton's lowering of a scalar atomic to one thread and a broadcast (Triton 3.x).
"""

import torch
import triton
import triton.language as tl

MAX_SPINS = 1 << 25  # flag polls before a wait is declared hopeless (~1 µs each over NVLink)
# the error word's values (tl.constexpr: the kernel reads them as globals)
ERR_TAKEN, ERR_ARRIVED, ERR_GENERATION = tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)


# rank and slot_offset not specialised: Triton would compile rank 1 (== 1) and odd-sized slots apart,
# and a rank that compiles its variant while its peer's kernel already spins waits seconds for it
# (two ranks simulated on one GPU trapped so; on two GPUs the first call's skew grows the same way)
@triton.jit(do_not_specialize=["slot_offset", "rank"])
def _allreduce_add_rms_norm_kernel(
    x_ptr,  # (M, hidden): this rank's partial sum
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    buffer_ptrs,  # (world,) int64: each rank's symmetric buffer, (2 slots, world sources, section)
    signal_ptrs,  # (world,) int64: each rank's symmetric int32 signal flags, (max_rows, world)
    gen_ptr,  # (max_rows,) int32, this rank's: generation of the last call per row
    error_addr,  # int64 address of an int32 in pinned host memory (0: fine)
    slot_offset,  # elements: the slot this call uses (consecutive calls alternate slots)
    section,  # elements: one source rank's part of a slot
    rank,
    hidden,
    eps,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_SPINS: tl.constexpr,
    TRAP: tl.constexpr,  # False in Triton's CPU interpreter (no inline PTX): only the error word
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
        gen = (tl.load(gen_ptr + row) & 0x3FFFFFFF) + 1  # never 0, the "no flag" value
        error = rank * 0
        for peer in tl.static_range(WORLD):
            if peer != rank:
                flags = tl.load(signal_ptrs + peer).to(tl.pointer_type(tl.int32))
                # spins only while the peer has not yet consumed this row's previous flag
                old = tl.atomic_cas(flags + row * WORLD + rank, 0, gen, sem="release", scope="sys")
                spins = 0
                while (old != 0) & (spins < MAX_SPINS):
                    old = tl.atomic_cas(
                        flags + row * WORLD + rank, 0, gen, sem="release", scope="sys"
                    )
                    spins += 1
                error = tl.where(old != 0, ERR_TAKEN, error)
        flags = tl.load(signal_ptrs + rank).to(tl.pointer_type(tl.int32))
        for peer in tl.static_range(WORLD):
            if peer != rank:
                # wait for the peer's flag of this generation and reset it: the pad is clean for
                # the next call
                old = tl.atomic_cas(flags + row * WORLD + peer, gen, 0, sem="acquire", scope="sys")
                spins = 0
                while (old == 0) & (spins < MAX_SPINS):
                    old = tl.atomic_cas(
                        flags + row * WORLD + peer, gen, 0, sem="acquire", scope="sys"
                    )
                    spins += 1
                error = tl.where(old == gen, error, tl.where(old == 0, ERR_ARRIVED, ERR_GENERATION))
        tl.store(gen_ptr + row, gen)
        if error != 0:
            tl.store(error_addr.to(tl.pointer_type(tl.int32)), error)
            if TRAP:  # membar.sys: the error word reaches the host; the trap ends the CUDA
                # context, so the rank's next CUDA call raises
                tl.inline_asm_elementwise(
                    "membar.sys; trap; mov.b32 $0, $1;",
                    "=r,r",
                    [error],
                    dtype=tl.int32,
                    is_pure=False,
                    pack=1,
                )
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
    h = acc.to(tl.bfloat16).to(tl.float32) + tl.load(residual_ptr + offs, mask=mask, other=0.0).to(
        tl.float32
    )
    tl.store(new_residual_ptr + offs, h.to(tl.bfloat16), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (h * rstd).to(tl.bfloat16).to(tl.float32) * w
    tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)


def allreduce_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    buffer_ptrs: torch.Tensor,
    signal_ptrs: torch.Tensor,
    slot: int,
    section: int,
    rank: int,
    generations: torch.Tensor,
    error: torch.Tensor,
    max_spins: int = MAX_SPINS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (M, hidden) bf16, contiguous; x is this rank's partial sum. Returns
    (rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual). Each rank's buffer holds
    2 slots of world sections of `section` elements. The caller checks that M rows fit the
    sections and the flags, and alternates the slot (0, 1) between consecutive calls.
    generations: (max_rows,) int32 on x's device, zeroed once with the flags; error: one int32 in
    pinned host memory (a CPU tensor under the interpreter), set when a wait failed (see above)."""
    m, hidden = x.shape
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    if m:
        block = triton.next_power_of_2(hidden)
        _allreduce_add_rms_norm_kernel[(m,)](
            x,
            residual,
            weight,
            out,
            new_residual,
            buffer_ptrs,
            signal_ptrs,
            generations,
            error.data_ptr(),
            slot * buffer_ptrs.numel() * section,
            section,
            rank,
            hidden,
            eps,
            WORLD=buffer_ptrs.numel(),
            BLOCK=block,
            MAX_SPINS=max_spins,
            TRAP=x.is_cuda,
            num_warps=min(max(block // 256, 1), 8),
        )
    return out, new_residual
