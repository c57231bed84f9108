"""The MLP's gated activation: silu(gate) * up over the fused gate_up projection (a decode row's
is done inside the down projection's GEMV instead: worker.layers.linear)."""

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # x: (N, 2 * intermediate) = [gate | up] -> (N, intermediate)
    if x.is_cuda:
        from nanoserve.worker.kernels import silu_and_mul as kernel

        return kernel(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
