"""nanoserve.worker.kernels.norm (fused RMSNorm, add+RMSNorm, SiLU-and-mul) against eager torch, on CPU by the interpreter."""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = (
    "1"  # read when @triton.jit decorates: set before worker.kernels loads
)

import pytest
import torch
import torch.nn.functional as F
from triton.runtime import interpreter

if "nanoserve.worker.kernels.norm" in sys.modules and not isinstance(
    sys.modules["nanoserve.worker.kernels.norm"]._rms_norm_kernel, interpreter.InterpretedFunction
):
    importlib.reload(sys.modules["nanoserve.worker.kernels.norm"])
from nanoserve.worker.kernels.norm import fused_add_rms_norm, rms_norm, silu_and_mul

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the eager RMSNorm: fp32 statistics, round to x.dtype, then scale by the weight
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 96])
def test_rms_norm(dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(5, 3, hidden, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    out = rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, torch_rms_norm(x, weight, 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_returns_sum_and_leaves_inputs(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 128, generator=gen).to(dtype)
    residual = torch.randn(7, 128, generator=gen).to(dtype)
    weight = torch.randn(128, generator=gen).to(dtype)
    x0, r0 = x.clone(), residual.clone()
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-6)
    ref_residual = (x.float() + residual.float()).to(dtype)
    if dtype == torch.float32:
        assert torch.equal(new_residual, ref_residual)
    else:  # the interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest): allow one ulp
        torch.testing.assert_close(new_residual, ref_residual, atol=0, rtol=2**-7)
    assert rel_err(out, torch_rms_norm(ref_residual, weight, 1e-6)) < TOL[dtype]
    assert torch.equal(x, x0) and torch.equal(residual, r0)


def test_rms_norm_on_strided_heads():
    # Qwen3 q_norm: per-head norm over head_dim of a strided (tokens, heads, head_dim) view of qkv
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(4, 6 * 32, generator=gen)
    q = qkv[:, : 4 * 32].view(4, 4, 32)
    weight = torch.randn(32, generator=gen)
    assert rel_err(rms_norm(q, weight, 1e-6), torch_rms_norm(q, weight, 1e-6)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2 * 1536, generator=gen).to(dtype)  # intermediate 1536 > one 1024 block
    gate, up = x.float().chunk(2, -1)
    out = silu_and_mul(x)
    assert out.shape == (6, 1536) and out.dtype == dtype
    assert rel_err(out, F.silu(gate) * up) < TOL[dtype]


def test_silu_and_mul_rejects_odd_width():
    with pytest.raises(ValueError, match="silu_and_mul"):
        silu_and_mul(torch.zeros(2, 7))
