"""Rotary position embedding (neox / Hugging Face rotate_half layout), applied to q and k."""

import functools

import torch
from torch import nn


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (N, H, D); cos, sin: (N, 1, D / 2). The two halves of D rotate as (x1, x2) pairs.
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@functools.cache
def cos_sin_table(
    head_dim: int, max_position: int, base: float, device: torch.device
) -> torch.Tensor:
    """(max_position, head_dim) fp32 [cos | sin], one per shape and device, shared by all layers."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        # a table, not a buffer: casting the model (model.to(torch.bfloat16)) must not lower its
        # precision, and every layer shares one copy
        self.key = (head_dim, max_position, float(base))

    def cache_on(self, device: torch.device) -> torch.Tensor:
        return cos_sin_table(*self.key, torch.device(device))

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: (N,); q: (N, Hq, D); k: (N, Hkv, D). Positions must be < max_position.
        cos, sin = self.cache_on(positions.device)[positions].unsqueeze(1).chunk(2, dim=-1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
