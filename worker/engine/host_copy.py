"""Host -> device copies of a step's small tensors (sampling knobs, row indices) that never wait for
the GPU: a pageable `.to(cuda)` synchronizes the stream, so the host stalls until the forward in
flight ends and the GPU then idles while the host launches the rest of the step."""

from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    data: Sequence | np.ndarray | torch.Tensor,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`data` (a list, array or CPU tensor) as a tensor on `device`. On CUDA through pinned memory
    and a non-blocking copy: the caching host allocator keeps the pinned block until the copy ran."""
    pin = device.type == "cuda"
    if isinstance(data, np.ndarray | torch.Tensor):
        host = torch.as_tensor(data)
        host = host if dtype is None else host.to(dtype)
        host = host.pin_memory() if pin else host
    else:  # a list: made in pinned memory at once
        host = torch.tensor(data, dtype=dtype, pin_memory=pin)
    return host.to(device, non_blocking=pin)
