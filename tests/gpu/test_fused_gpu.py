"""The fused q/k-norm + rotary kernel on CUDA at Qwen3 shapes equals the torch layers."""
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("n", [1, 257, 4096])
def test_qk_norm_rope_matches_torch(n):
    from worker.kernels import qk_norm_rope
    from worker.layers.rotary_embedding import RotaryEmbedding, apply_rotary
    torch.manual_seed(0)
    hq, hkv, d, dev = 16, 8, 128, torch.device("cuda")
    qkv = torch.randn(n, (hq + 2 * hkv) * d, device=dev, dtype=torch.bfloat16)
    w_q = (1 + 0.1 * torch.randn(d, device=dev)).bfloat16()
    w_k = (1 + 0.1 * torch.randn(d, device=dev)).bfloat16()
    positions = torch.randint(0, 40960, (n,), device=dev)
    rope = RotaryEmbedding(d, 40960, 1e6)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(n, hq, d), k.view(n, hkv, d)

    def torch_norm(x, w):  # the CPU path of RMSNorm, on CUDA tensors
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * xf.to(x.dtype)

    cos, sin = rope.cache_on(dev)[positions].unsqueeze(1).chunk(2, dim=-1)
    ref_q = apply_rotary(torch_norm(q, w_q), cos, sin)
    ref_k = apply_rotary(torch_norm(k, w_k), cos, sin)
    qk_norm_rope(q, k, w_q, w_k, rope.cache_on(dev), positions, 1e-6)
    torch.testing.assert_close(q, ref_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k, ref_k, atol=2e-2, rtol=2e-2)
