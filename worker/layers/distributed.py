"""Tensor-parallel rank helpers for the model layers.

The TP group is the default torch.distributed group (ModelRunner initialises it: NCCL on CUDA, gloo
on CPU); without it every helper degrades to world size 1, the plain single-process path. On CUDA,
small all-reduces (every decode step's) go through SymmetricAllReduce instead of NCCL.
"""

import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_tp_rank() -> int:
    return dist.get_rank() if _initialized() else 0


def get_tp_world_size() -> int:
    return dist.get_world_size() if _initialized() else 1


# the fused all-reduce + add + RMSNorm runs one program per row, each with its own barrier. On 2 x
# H200 (nanoserve.benchmarks.allreduce, b076b35/0998945), rows of 4096, in a loop of calls: 5.1 µs for 1
# row, 7.3 for 64, 14.3 for 256 against 8.4, 13.0 and 24.1 for one-shot + norm kernel. Yet in the
# model, fused at every decode batch cut 8B tp=2 throughput from 12,964 to 11,365 tok/s (0998945,
# cause not found) -> small batches only (batch-1 latency: 3.674 ms unfused, 3.522 fused with remote
# reads, 3.457 with pushes, 3.318 with the skinny GEMMs too)
# The fused kernel's two slots are safe only while a rank's kernels run strictly in order (one
# stream, no programmatic dependent launch, no collective on a second stream): see
# worker.kernels.allreduce_norm, whose generation-numbered flags trap when this is broken. Its
# programs of one call wait on each other across GPUs, so they must all be resident at once:
# do not raise FUSED_MAX_ROWS far without a grid-stride (persistent) design.
FUSED_MAX_ROWS = 16


class SymmetricAllReduce:
    """One-shot all-reduce over NVLink through torch's symmetric memory: each rank copies its tensor
    into its own buffer of a symmetric allocation, the ranks meet at a barrier on the signal pads,
    and each sums every rank's buffer with peer loads. One kernel and no NCCL protocol: a few µs for
    the KiB-sized messages of a decode step, against ~10 µs for NCCL (nanoserve.benchmarks.allreduce).
    CUDA-graph safe: the buffer and the signal pads have fixed addresses and reset themselves."""

    def __init__(
        self,
        device: torch.device,
        max_bytes: int,
        dtype: torch.dtype = torch.bfloat16,
        max_rows: int = 512,
    ):
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        assert group is not None  # init_process_group ran (ModelRunner under tensor parallelism)
        self.group_name = group.group_name
        self.dtype, self.max_numel, self.max_rows = dtype, max_bytes // dtype.itemsize, max_rows
        self.buffer = symm_mem.empty(self.max_numel, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)
        # all_reduce_add_rms_norm's own symmetric memory: (2 slots, world sources, max_numel) data
        # and (max_rows, world) int32 flags, zeroed here (the caller's all-rank agreement orders
        # it before any use)
        self.rank, world = self.handle.rank, self.handle.world_size
        self.fused_buffer = symm_mem.empty(2 * world * self.max_numel, dtype=dtype, device=device)
        fused_handle = symm_mem.rendezvous(self.fused_buffer, self.group_name)
        self.flags = symm_mem.empty(max_rows * world, dtype=torch.int32, device=device).zero_()
        flags_handle = symm_mem.rendezvous(self.flags, self.group_name)
        self.buffer_ptrs = torch.tensor(fused_handle.buffer_ptrs, dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor(flags_handle.buffer_ptrs, dtype=torch.int64, device=device)
        self.fused_handles = (fused_handle, flags_handle)
        # per row, the generation of the last fused call (the flags carry it); the kernel's error
        # word lives in pinned host memory, readable after it trapped (error_message)
        self.generations = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, pin_memory=True)

    def fits(self, x: torch.Tensor) -> bool:
        # 16-byte vectors: the kernel's alignment of the element count and of the data pointer
        return (
            x.dtype == self.dtype
            and x.numel() <= self.max_numel
            and x.is_contiguous()
            and (x.numel() * x.element_size()) % 16 == 0
            and x.data_ptr() % 16 == 0
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place (each thread overwrites only elements it copied out
        before the barrier)."""
        symm = self.buffer[: x.numel()].view(x.shape)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(symm, x, "sum", self.group_name, x)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, slot: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(sum_ranks(x) + residual), sum_ranks(x) + residual) in one kernel, or None
        when x does not fit. Consecutive calls must use different slots (0 or 1): a rank may
        overwrite a slot only once every peer is past the call that read it."""
        if not (
            x.dtype == torch.bfloat16
            and self.fits(x)
            and x.dim() == 2  # the kernel is bf16
            and x.shape[0] <= min(self.max_rows, FUSED_MAX_ROWS)
            and residual.shape == x.shape
            and residual.is_contiguous()
        ):
            return None
        from nanoserve.worker.kernels.allreduce_norm import allreduce_add_rms_norm

        return allreduce_add_rms_norm(
            x,
            residual,
            weight,
            eps,
            self.buffer_ptrs,
            self.flag_ptrs,
            slot,
            self.max_numel,
            self.rank,
            self.generations,
            self.error,
        )

    def error_message(self) -> str | None:
        from nanoserve.worker.kernels.allreduce_norm import ERR_ARRIVED, ERR_GENERATION, ERR_TAKEN

        code = int(self.error[0])
        return {
            0: None,
            ERR_TAKEN.value: "a peer never took this rank's flag (it stopped or died)",
            ERR_ARRIVED.value: "a peer never arrived (it stopped, died or ran another batch size)",
            ERR_GENERATION.value: "a peer's flag was of another call (kernels ran out of order)",
        }.get(code, f"error {code}")

    def close(self) -> None:
        del self.handle, self.buffer, self.fused_handles, self.fused_buffer, self.flags


_symmetric: SymmetricAllReduce | None = None


def init_symmetric_all_reduce(
    device: torch.device, max_bytes: int, dtype: torch.dtype, max_rows: int = 512
) -> None:
    """Every rank calls this after init_process_group (CUDA only). All ranks agree whether it
    works (a rank that used it while another used NCCL would wait forever), else NCCL stays."""
    global _symmetric
    comm, error = None, ""
    try:
        comm = SymmetricAllReduce(device, max_bytes, dtype, max_rows)
    except Exception as e:  # noqa: BLE001 - no P2P, no symmetric-memory backend in this torch build, ...
        error = f"{type(e).__name__}: {e}"
    ok = torch.tensor([int(comm is not None)], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item():
        _symmetric = comm
        logger.info("all-reduces up to %d KiB through symmetric memory", max_bytes // 1024)
    else:
        logger.warning(
            "symmetric-memory all-reduce unavailable (%s): NCCL for all sizes",
            error or "another rank failed",
        )


def fused_all_reduce_error() -> str | None:
    """Why the fused all-reduce trapped on this rank, or None (the GPU context is unusable then)."""
    if _symmetric is None:
        return None
    reason = _symmetric.error_message()
    return None if reason is None else f"fused all-reduce timed out or failed: {reason}"


def close_symmetric_all_reduce() -> None:
    global _symmetric
    if _symmetric is not None:
        _symmetric.close()
        _symmetric = None


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the TP ranks, in place; returns x."""
    if get_tp_world_size() > 1:
        if _symmetric is not None and _symmetric.fits(x):
            return _symmetric(x)
        dist.all_reduce(x)
    return x


def all_reduce_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, slot: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The all-reduce of a row-parallel layer fused with the residual add + RMSNorm after it, or
    None where only the unfused path runs (one rank, no symmetric memory, too many rows)."""
    if _symmetric is None or get_tp_world_size() == 1:
        return None
    return _symmetric.add_rms_norm(x, residual, weight, eps, slot)


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's x along dim, in rank order; every rank gets the result."""
    world_size = get_tp_world_size()
    if world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
