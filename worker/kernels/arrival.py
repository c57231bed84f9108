"""Arrival counters for kernels whose last program merges the others' partial results in the same
launch (decode_attention's shares, split_k_gemm's K slices): zero between launches, persistent."""

import torch

# device -> counter buffers, the newest last. int32, all zero between launches (the merging
# program resets its counter). Older buffers stay alive: a CUDA graph captured with one replays it.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def arrival_counters(device: torch.device, size: int, user: str) -> torch.Tensor:
    """A zeroed int32 buffer of >= size counters that persists across calls and graph replays.
    Kernels on one stream may share it: each resets what it used before it ends.

    Grows only outside CUDA-graph capture (an allocation there would belong to the graph's pool
    and be reused by other tensors between replays); the engine's eager warm-up of each bucket before
    capturing it, largest first, sizes it in time. `user` names the caller in that error.
    """
    buffers = _COUNTERS.setdefault(device, [])
    if buffers and buffers[-1].numel() >= size:
        return buffers[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        have = buffers[-1].numel() if buffers else 0
        raise RuntimeError(
            f"{user}: capturing a CUDA graph needs {size} arrival counters on "
            f"{device} but only {have} exist; run the same shape eagerly before capture"
        )
    buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]
