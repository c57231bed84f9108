"""The fused q/k RMSNorm + rotary kernel (Triton interpreter on CPU) equals the torch layers."""
import pytest
import torch

from worker.kernels import qk_norm_rope
from worker.layers.layernorm import RMSNorm
from worker.layers.rotary_embedding import RotaryEmbedding


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 32), (2, 2, 16)])
def test_matches_torch_layers(dtype, tol, hq, hkv, d):
    torch.manual_seed(0)
    n = 7
    qkv = torch.randn(n, (hq + 2 * hkv) * d).to(dtype)
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.1 * torch.randn(d))
        k_norm.weight.copy_(1 + 0.1 * torch.randn(d))
    q_norm, k_norm = q_norm.to(dtype), k_norm.to(dtype)
    rope = RotaryEmbedding(d, 512, 10000.0)
    positions = torch.tensor([0, 1, 5, 100, 511, 3, 3])
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(n, hq, d), k.view(n, hkv, d)
    with torch.no_grad():
        ref_q, ref_k = rope(positions, q_norm(q.clone()), k_norm(k.clone()))
    v_before = qkv[:, (hq + hkv) * d:].clone()
    qk_norm_rope(q, k, q_norm.weight.data, k_norm.weight.data, rope.cache_on(torch.device("cpu")),
                 positions, 1e-6)  # in place on the views of qkv
    assert torch.allclose(q.float(), ref_q.float(), atol=tol, rtol=tol)
    assert torch.allclose(k.float(), ref_k.float(), atol=tol, rtol=tol)
    assert torch.equal(qkv[:, (hq + hkv) * d:], v_before)  # v untouched
