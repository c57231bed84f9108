"""Host -> device copies of a step's small tensors (sampling knobs, row indices) that never wait for
the GPU: a pageable `.to(cuda)` synchronizes the stream, so the host stalls until the forward in
flight ends and the GPU then idles while the host launches the rest of the step. On CUDA they run
on a side stream, so a copy starts when the host asks rather than when the compute stream reaches
it, and the compute stream waits on an event, not on a copy engine."""

import functools
from collections.abc import Sequence

import numpy as np
import torch


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
    side = _copy_stream(device)
    with torch.cuda.stream(side):
        out = host.to(device, non_blocking=True)
    compute.wait_stream(side)
    out.record_stream(compute)
    return out


@functools.cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)
