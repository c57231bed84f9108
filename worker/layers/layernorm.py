"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer and,
under tensor parallelism, with the all-reduce of the row-parallel layer before that add."""

import torch
from torch import nn

from nanoserve.worker.layers.distributed import (
    all_reduce,
    all_reduce_add_rms_norm,
    get_tp_world_size,
)
from nanoserve.worker.layers.linear import load_whole, set_weight_loader, takes_skinny


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, all_reduce_slot: int | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        set_weight_loader(self.weight, load_whole)
        # set on norms that follow a RowParallelLinear(reduce_results=False): with a residual, x is
        # then this rank's partial sum. Consecutive such norms must use different slots (0, 1).
        self.all_reduce_slot = all_reduce_slot
        self.fuse_decode = False  # fused_linear's kernel (EngineConfig.decode_fusions; ModelRunner)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # x: (..., hidden). With residual: x + residual is normalised and also returned as the new
        # residual stream. The statistics are taken in float32, as Hugging Face's Qwen3RMSNorm.
        if residual is not None and self.all_reduce_slot is not None:
            fused = all_reduce_add_rms_norm(
                x, residual, self.weight, self.eps, self.all_reduce_slot
            )
            if fused is not None:
                return fused
            x = all_reduce(x)
        if x.is_cuda:  # one Triton kernel instead of ~8 small torch ones
            from nanoserve.worker.kernels import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
            residual = x
        x_f = x.float()
        x_f = x_f * torch.rsqrt(x_f.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * x_f.to(x.dtype)
        return out if residual is None else (out, residual)

    def fused_linear(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        gated: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This norm (after its residual add) and the bias-free linear layer of `weight` after it
        in one kernel, where that layer takes the skinny kernel (a decode row on CUDA) and on one
        rank (no all-reduce to fuse): (y, the next residual); gated: y is the MLP's
        silu(gate) * up. None elsewhere: the caller runs the norm, then the layer."""
        if not self.fuse_decode or get_tp_world_size() > 1 or not takes_skinny(x, weight):
            return None
        from nanoserve.worker.kernels.skinny_gemm import norm_skinny_gemm

        return norm_skinny_gemm(x, residual, self.weight, self.eps, weight, gated)
