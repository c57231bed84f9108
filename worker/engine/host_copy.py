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
    if isinstance(data, np.ndarray):
        host = torch.from_numpy(data)
        host = host if dtype is None else host.to(dtype)
    elif isinstance(data, torch.Tensor):
        host = data if dtype is None else data.to(dtype)
    else:
        host = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
