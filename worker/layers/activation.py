"""The MLP's gated activation: silu(gate) * up over the fused gate_up projection."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (N, 2 * intermediate) = [gate | up] -> (N, intermediate)
        if x.is_cuda:
            from nanoserve.worker.kernels import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
