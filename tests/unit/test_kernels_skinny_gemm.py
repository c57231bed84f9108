"""The small-M GEMM kernel (Triton interpreter on CPU) equals F.linear for the M the decode buckets use
and for widths that do not divide its tiles."""

import pytest
import torch
import torch.nn.functional as F

from nanoserve.worker.kernels import skinny_gemm as skinny_gemm_module
from nanoserve.worker.kernels.norm import fused_add_rms_norm, rms_norm, silu_and_mul
from nanoserve.worker.kernels.skinny_gemm import (
    MAX_M,
    norm_skinny_gemm,
    skinny_gemm,
    skinny_gemm_config,
)
from nanoserve.worker.layers.linear import gated_linear


def _cfg(bm: int, bn: int, bk: int, stages: int = 1) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, LOOP_STAGES=stages, num_warps=4)


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n, k", [(64, 96), (40, 200), (3, 16)])
def test_matches_linear_fp32(m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k), torch.randn(n, k)
    torch.testing.assert_close(skinny_gemm(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "m, n, k, cfg",
    [
        (1, 33, 520, _cfg(1, 4, 64)),  # K not a multiple of the block
        (1, 50, 1000, _cfg(1, 8, 128, stages=2)),  # pipelined loop, N % BLOCK_N != 0
        (5, 7, 300, _cfg(8, 2, 32, stages=3)),
        (2, 24, 40, _cfg(2, 4, 64)),  # K shorter than one block
    ],
)
def test_given_tiles_match_linear(m, n, k, cfg):
    torch.manual_seed(n + k)
    x, w = torch.randn(m, k), torch.randn(n, k)
    torch.testing.assert_close(skinny_gemm(x, w, cfg), F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_bf16_and_strided_rows():
    torch.manual_seed(0)
    x = torch.randn(4, 256).bfloat16()[::2]  # (2, 256), row stride 512
    w = torch.randn(48, 256).bfloat16()
    for cfg in (None, _cfg(2, 4, 64, stages=2)):
        y = skinny_gemm(x, w, cfg)
        assert y.dtype == torch.bfloat16 and y.shape == (2, 48)
        torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), atol=0.1, rtol=2e-2)


@pytest.mark.parametrize(
    "m, inter, k, cfg",
    [
        (1, 48, 96, None),  # the M = 1 rule's tiles, halved: 2 gate and 2 up rows a program
        (1, 33, 520, _cfg(1, 4, 64, stages=2)),  # I % BLOCK_N != 0, K not a multiple
        (3, 10, 40, None),
    ],
)
def test_gated_is_silu_of_gate_times_up(m, inter, k, cfg):
    torch.manual_seed(inter + k)
    x, w = torch.randn(m, k), torch.randn(2 * inter, k)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    y = skinny_gemm(x, w, cfg, gated=True)
    assert y.shape == (m, inter)
    torch.testing.assert_close(y, F.silu(gate) * up, atol=1e-4, rtol=1e-4)


def test_gated_bf16_rounds_gate_and_up_as_the_unfused_pair():
    # gate and up are rounded to bf16 before the SiLU, as SiluAndMul reads the bf16 gate_up output
    torch.manual_seed(1)
    x, w = torch.randn(1, 256).bfloat16(), torch.randn(64, 256).bfloat16()
    y = skinny_gemm(x, w, gated=True)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, silu_and_mul(skinny_gemm(x, w)), atol=0, rtol=0)
    with pytest.raises(ValueError, match="even N"):
        skinny_gemm(x, w[:63], gated=True)


def test_gated_linear_takes_only_a_decode_row_on_cuda():
    # elsewhere the MLP runs gate_up, then SiluAndMul (None tells it so)
    assert gated_linear(torch.randn(1, 16), torch.randn(8, 16)) is None


def test_config_rule():
    # M = 1: the best tiles of the L2-cold H200 sweep (0.6B o_proj and down_proj, 8B qkv)
    assert skinny_gemm_config(1, 1024, 2048) == dict(
        BLOCK_M=1, BLOCK_N=2, BLOCK_K=2048, LOOP_STAGES=1, num_warps=8, num_stages=1
    )
    assert skinny_gemm_config(1, 1024, 3072) == dict(
        BLOCK_M=1, BLOCK_N=2, BLOCK_K=512, LOOP_STAGES=3, num_warps=4, num_stages=1
    )
    assert skinny_gemm_config(1, 6144, 4096) == dict(
        BLOCK_M=1, BLOCK_N=4, BLOCK_K=1024, LOOP_STAGES=2, num_warps=4, num_stages=1
    )
    for n, k in [(48, 1000), (40, 2500)]:  # the narrow rules' tiles on widths they do not divide
        x, w = torch.randn(1, k), torch.randn(n, k)
        torch.testing.assert_close(skinny_gemm(x, w), F.linear(x, w), atol=1e-3, rtol=1e-4)
    for m in range(1, MAX_M + 1):
        for n, k in [(1024, 3072), (4096, 6144), (24576, 4096), (151936, 1024), (64, 4096)]:
            cfg = skinny_gemm_config(m, n, k)
            assert cfg["BLOCK_M"] >= m and cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] <= 8192
    # a narrow layer at M > 1: the rule's own choice
    x, w = torch.randn(2, 4096), torch.randn(64, 4096)
    torch.testing.assert_close(skinny_gemm(x, w), F.linear(x, w), atol=1e-3, rtol=1e-4)


def test_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="M=9"):
        skinny_gemm(torch.randn(MAX_M + 1, 16), torch.randn(4, 16))
    with pytest.raises(ValueError, match="x width 16 must be weight's K=8"):
        skinny_gemm(torch.randn(1, 16), torch.randn(4, 8))
    with pytest.raises(ValueError, match="stride"):
        skinny_gemm(torch.randn(1, 16), torch.randn(16, 4).t())
    with pytest.raises(ValueError, match="dtype"):
        skinny_gemm(torch.randn(1, 16), torch.randn(4, 16).bfloat16())
    with pytest.raises(ValueError, match="2-D"):
        skinny_gemm(torch.randn(16), torch.randn(4, 16))
    with pytest.raises(ValueError, match="BLOCK_M >= M=2"):
        skinny_gemm(torch.randn(2, 16), torch.randn(4, 16), _cfg(1, 2, 16))
    assert skinny_gemm(torch.randn(0, 16), torch.randn(4, 16)).shape == (0, 4)
    assert not skinny_gemm(torch.randn(2, 0), torch.randn(4, 0)).any()


@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m, n, k, block_k", [(1, 48, 96, None), (2, 40, 200, 64)])
def test_norm_fused_is_the_norm_then_the_gemm(monkeypatch, with_residual, gated, m, n, k, block_k):
    torch.manual_seed(n + k + m)
    x = torch.randn(m, k).bfloat16()
    residual = torch.randn(m, k).bfloat16() if with_residual else None
    norm_weight = (1 + 0.1 * torch.randn(k)).bfloat16()
    w = (0.1 * torch.randn(n, k)).bfloat16()
    if block_k:  # several K steps: the statistics and the residual store span them
        cfg = dict(skinny_gemm_config(m, n, k), BLOCK_K=block_k)
        monkeypatch.setattr(skinny_gemm_module, "skinny_gemm_config", lambda *a: cfg)
    y, new_residual = norm_skinny_gemm(x, residual, norm_weight, 1e-6, w, gated=gated)
    monkeypatch.undo()
    if residual is None:
        h, expected_residual = rms_norm(x, norm_weight, 1e-6), x
    else:
        h, expected_residual = fused_add_rms_norm(x, residual, norm_weight, 1e-6)
    assert torch.equal(new_residual, expected_residual)
    assert new_residual is not x or residual is None
    ref = skinny_gemm(h, w, gated=gated)
    assert y.shape == ref.shape and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=1e-2)


def test_norm_fused_rejects_mismatched_inputs():
    x, w = torch.randn(1, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="residual"):
        norm_skinny_gemm(x, torch.randn(1, 8), torch.ones(16), 1e-6, w)
    with pytest.raises(ValueError, match="norm weight"):
        norm_skinny_gemm(x, None, torch.ones(8), 1e-6, w)


@pytest.mark.parametrize("gated, norm", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("k", [96, 200])  # K in one step (the early load), and past one step
def test_weights_loaded_early_give_the_same_bits(monkeypatch, gated, norm, k):
    # PREFETCH_WEIGHTS moves only where W is read (before the PDL wait), never the arithmetic
    gen = torch.Generator().manual_seed(k)
    x, w = torch.randn(1, k, generator=gen).bfloat16(), torch.randn(48, k, generator=gen).bfloat16()
    residual, nw = torch.randn(1, k, generator=gen).bfloat16(), torch.randn(k).bfloat16()

    def run():
        if norm:
            return norm_skinny_gemm(x, residual, nw, 1e-6, w, gated)[0]
        return skinny_gemm(x, w, _cfg(1, 4, 128, 2), gated=gated)

    before = run()
    monkeypatch.setattr(skinny_gemm_module, "PREFETCH_WEIGHTS", True)
    assert torch.equal(run(), before)
