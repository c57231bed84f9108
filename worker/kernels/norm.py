"""Fused elementwise kernels of the Qwen3 decoder layer: RMSNorm (with the residual add) and SiLU-
and-mul.

One pass over each tensor instead of the several eager ops of the torch layers; each program owns
one row.
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.pdl import pdl_launch, pdl_wait


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_nr,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # every load first: a load after a store may alias it and waits for it, so the weight read
    # after the residual store cost a second memory latency a launch (decode: latency-bound)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(new_residual_ptr + row * stride_nr + cols, x.to(dtype), mask=mask)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    # round to the activation dtype before the weight, as the torch RMSNorm does
    y = (x * rstd).to(dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(dtype), mask=mask)


def _rows(x: torch.Tensor, hidden: int, name: str) -> torch.Tensor:
    if x.shape[-1] != hidden:
        raise ValueError(f"{name} last dim {x.shape[-1]} != weight size {hidden}")
    x2 = x.reshape(-1, hidden)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    hidden = weight.shape[0]
    x2 = _rows(x, hidden, "x")
    r2 = _rows(residual, hidden, "residual") if residual is not None else x2
    if residual is not None and r2.shape != x2.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else out
    if x2.shape[0]:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight,
            out,
            new_residual,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            new_residual.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(max(block // 256, 1), 8),
            **pdl_launch(x),
        )
    return out.view(x.shape), new_residual.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (..., hidden) -> x / rms(x) * weight, computed in fp32, returned in x.dtype."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual); the inputs are not modified."""
    return _launch(x, residual, weight, eps)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: (num_tokens, 2 * intermediate), gate then up (the fused gate_up_proj) -> (num_tokens, intermediate)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(
            f"silu_and_mul needs a (num_tokens, 2 * intermediate) row-major x, got {tuple(x.shape)}"
        )
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](
            x,
            out,
            x.stride(0),
            out.stride(0),
            inter,
            BLOCK=block,
            num_warps=4,
            **pdl_launch(x),
        )
    return out
