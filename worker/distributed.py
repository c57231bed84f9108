"""Tensor-parallel rank helpers for the model layers.

The TP group is the default torch.distributed group (ModelRunner initialises it: NCCL on CUDA, gloo
on CPU); without it every helper degrades to world size 1, the plain single-process path.
"""
import torch
import torch.distributed as dist


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_tp_rank() -> int:
    return dist.get_rank() if _initialized() else 0


def get_tp_world_size() -> int:
    return dist.get_world_size() if _initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the TP ranks, in place."""
    if get_tp_world_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's x along dim, in rank order; every rank gets the result."""
    world_size = get_tp_world_size()
    if world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
