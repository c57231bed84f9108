"""Copies between host and device that never wait for the GPU: a step's small tensors (sampling
knobs, row indices) to the device, its sampled ids back, and the pinned buffers a step's inputs
pass through (load_step: one copy, then the attention context). A pageable `.to(cuda)`
synchronizes the stream, so the host stalls until the forward in flight ends and the GPU then
idles while the host launches the rest of the step. On CUDA the copies run on side streams, so a
copy starts when the host asks rather than when the compute stream reaches it, and the compute
stream waits on an event, not on a copy engine."""

import functools
from collections.abc import Sequence

import numpy as np
import torch

from nanoserve.worker.layers.context import set_context
from nanoserve.worker.runner.step_inputs import StepInputs, split_message


def to_device(
    data: Sequence | np.ndarray | torch.Tensor,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`data` (a list, array or CPU tensor) as a tensor on `device`. On CUDA through pinned memory
    and a non-blocking copy on the side stream, which the current stream then waits for: the
    caching host allocator keeps the pinned block until the copy ran, and the device tensor,
    allocated from the side stream's pool, is marked used by the current one."""
    pin = device.type == "cuda"
    if isinstance(data, np.ndarray | torch.Tensor):
        host = torch.as_tensor(data)
        host = host if dtype is None else host.to(dtype)
        host = host.pin_memory() if pin else host
    else:  # a list: made in pinned memory at once
        host = torch.tensor(data, dtype=dtype, pin_memory=pin)
    if not pin:
        return host.to(device)
    compute = torch.cuda.current_stream(device)
    side = side_stream(device, "to_device")
    with torch.cuda.stream(side):
        out = host.to(device, non_blocking=True)
    compute.wait_stream(side)
    out.record_stream(compute)
    return out


# The host's wait for a step's sampled ids (ModelRunner, lookahead) spins on its CPU by CUDA's
# default (a host with more cores than GPUs); True: it sleeps until the GPU signals
# (cudaEventBlockingSync), leaving the CPU to other threads at the cost of a wake-up a step.
# benchmarks.variants `blockwait` measures that cost.
BLOCKING_WAIT = False


def to_host_async(t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    """Start copying CUDA tensor t into pinned host memory on a side stream, after the work the
    current stream has queued: (the host tensor, an event to wait on before reading it). The
    current stream goes on without waiting on a copy engine; t stays allocated until it is read."""
    side = side_stream(t.device, "to_host")
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        copied = torch.cuda.Event(blocking=BLOCKING_WAIT)
        copied.record(side)
    t.record_stream(side)
    return host, copied


@functools.cache
def side_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """One side stream a (device, role): copies of one direction queue behind each other only, so
    the ids going to the host (behind the sampler) never hold up the next step's inputs."""
    return torch.cuda.Stream(device)


class PinnedRing:
    """Two pinned host buffers used in turn for a step's inputs (ModelRunner.load_inputs, the
    decode graphs): take() hands out the next one once the copy out of its last use is done, with
    its index and the event the caller records after that copy."""

    def __init__(self, numel: int, dtype: torch.dtype):
        self.buffers = [torch.empty(numel, dtype=dtype, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.next = 0

    def take(self) -> tuple[int, torch.Tensor, torch.cuda.Event]:
        i, self.next = self.next, self.next ^ 1
        self.copied[i].synchronize()
        return i, self.buffers[i], self.copied[i]


def load_step(
    x: StepInputs,
    msg: np.ndarray | None,
    device: torch.device,
    pinned: PinnedRing | None,
    flash_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy a step's inputs (`msg`: x encoded, when the caller has it) to the device (on CUDA: one
    copy from a `pinned` buffer) and set the attention context; (ids, positions, logit rows)."""
    msg = x.encode() if msg is None else msg
    if pinned is not None:
        _, buf, done = pinned.take()
        buf[: len(msg)].numpy()[:] = msg
        flat = buf[: len(msg)].to(device, non_blocking=True)
        done.record()
    else:
        flat = torch.from_numpy(msg)
    ids, pos, slots, cu, ctx_lens, tables, rows = split_message(flat, x.dims)
    ctx_lens = ctx_lens.int()
    cu_k = None  # only the flash-attn prefill reads it
    if x.is_prefill and flash_attn:
        cu_k = torch.nn.functional.pad(ctx_lens.cumsum(0, dtype=torch.int32), (1, 0))
    set_context(
        is_prefill=x.is_prefill,
        cu_seqlens_q=cu.int(),
        cu_seqlens_k=cu_k,
        max_seqlen_q=x.max_seqlen_q,
        max_seqlen_k=x.max_seqlen_k,
        slot_mapping=slots.int(),
        context_lens=ctx_lens,
        block_tables=tables.int(),
    )
    return ids, pos, rows
