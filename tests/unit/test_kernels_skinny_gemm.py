"""The small-M GEMM kernel (Triton interpreter on CPU) equals F.linear, for the M the decode buckets use
and for widths that do not divide its tiles."""
import pytest
import torch
import torch.nn.functional as F

from worker.kernels.skinny_gemm import MAX_M, skinny_gemm, skinny_gemm_config


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n, k", [(64, 96), (40, 200), (3, 16)])
def test_matches_linear_fp32(m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k), torch.randn(n, k)
    torch.testing.assert_close(skinny_gemm(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_bf16_and_strided_rows():
    torch.manual_seed(0)
    x = torch.randn(4, 256).bfloat16()[::2]  # (2, 256), row stride 512
    w = torch.randn(48, 256).bfloat16()
    y = skinny_gemm(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 48)
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), atol=0.1, rtol=2e-2)


def test_every_tile_of_the_config_rule_is_exact_in_fp32():
    torch.manual_seed(1)
    for m, n, k in [(1, 4096, 1024), (8, 1024, 3072)]:
        cfg = skinny_gemm_config(m, n, k)
        assert cfg["BLOCK_M"] >= m and cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] <= 32768
    x, w = torch.randn(1, 520), torch.randn(33, 520)  # K not a multiple of BLOCK_K
    torch.testing.assert_close(skinny_gemm(x, w, dict(BLOCK_M=1, BLOCK_N=4, BLOCK_K=128)),
                               F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="M <= 8"):
        skinny_gemm(torch.randn(MAX_M + 1, 16), torch.randn(4, 16))
    with pytest.raises(ValueError, match="shared K"):
        skinny_gemm(torch.randn(1, 16), torch.randn(4, 8))
    assert skinny_gemm(torch.randn(0, 16), torch.randn(4, 16)).shape == (0, 4)
