"""The split-K decode GEMM (Triton interpreter on CPU) equals F.linear for every split count, on
widths that do not divide its tiles, repeats bit for bit, and leaves its arrival counters at zero."""

import pytest
import torch
import torch.nn.functional as F

import tests.unit.interpreted_kernels  # noqa: F401  (the interpreter and its numpy shim first)
from nanoserve.worker.kernels import arrival
from nanoserve.worker.kernels.split_k_gemm import MAX_M, split_k_gemm


def _cfg(bm: int, bn: int, bk: int, split: int) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=4, num_stages=2)


@pytest.mark.parametrize("split", [1, 2, 3, 4])
@pytest.mark.parametrize("m, n", [(16, 32), (5, 40), (33, 17)])
def test_matches_linear_fp32(split, m, n):
    torch.manual_seed(m * 100 + n + split)
    k = 16 * split * 3
    x, w = torch.randn(m, k), torch.randn(n, k)
    y = split_k_gemm(x, w, _cfg(16, 16, 16, split))
    torch.testing.assert_close(y, F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_bf16_repeats_exactly_and_resets_counters():
    torch.manual_seed(1)
    x, w = torch.randn(20, 128).bfloat16(), torch.randn(48, 128).bfloat16()
    cfg = _cfg(32, 16, 32, 4)
    first = split_k_gemm(x, w, cfg)
    assert first.dtype == torch.bfloat16 and first.shape == (20, 48)
    torch.testing.assert_close(first.float(), F.linear(x.float(), w.float()), atol=0.1, rtol=2e-2)
    counters = arrival._COUNTERS[torch.device("cpu")][-1]
    assert counters.numel() >= 3 and not counters.any()
    assert torch.equal(split_k_gemm(x, w, cfg), first)


def test_strided_rows():
    torch.manual_seed(2)
    x = torch.randn(8, 64)[::2]  # (4, 64), row stride 128
    w = torch.randn(16, 64)
    torch.testing.assert_close(
        split_k_gemm(x, w, _cfg(16, 16, 16, 2)), F.linear(x, w), atol=1e-4, rtol=1e-4
    )


def test_rejects_what_it_cannot_run():
    cfg = _cfg(16, 16, 16, 2)
    with pytest.raises(ValueError, match="does not fit"):
        split_k_gemm(torch.randn(MAX_M + 1, 32), torch.randn(4, 32), cfg)
    with pytest.raises(ValueError, match="does not fit"):
        split_k_gemm(torch.randn(2, 32), torch.randn(4, 64), cfg)
    with pytest.raises(ValueError, match="multiple of SPLIT_K"):
        split_k_gemm(torch.randn(2, 48), torch.randn(4, 48), cfg)
    with pytest.raises(ValueError, match="contiguous rows"):
        split_k_gemm(torch.randn(2, 32), torch.randn(32, 4).t(), cfg)
    with pytest.raises(ValueError, match="2-D"):
        split_k_gemm(torch.randn(32), torch.randn(4, 32), cfg)
    assert split_k_gemm(torch.randn(0, 32), torch.randn(4, 32), cfg).shape == (0, 4)


def test_config_table_lookup(monkeypatch):
    from nanoserve.worker.kernels import split_k_gemm as sk

    a, b = _cfg(16, 16, 16, 4), _cfg(32, 16, 16, 2)
    monkeypatch.setattr(sk, "CONFIGS", {(8, 64): [(16, a), (32, None), (64, b)]})
    assert sk.split_k_config(2, 8, 64) is a and sk.split_k_config(16, 8, 64) is a
    assert sk.split_k_config(17, 8, 64) is None  # cuBLAS in that range
    assert sk.split_k_config(64, 8, 64) is b
    assert sk.split_k_config(65, 8, 64) is None  # past the last entry
    assert sk.split_k_config(16, 8, 128) is None  # a shape not in the table


def test_table_entries_fit_their_shapes():
    """Every config in the shipped table divides its K and holds its M (what split_k_gemm checks)."""
    from nanoserve.worker.kernels.split_k_gemm import CONFIGS

    for (n, k), rows in CONFIGS.items():
        assert [m for m, _ in rows] == sorted(m for m, _ in rows)
        for m, cfg in rows:
            assert m <= MAX_M
            if cfg is not None:
                assert k % (cfg["SPLIT_K"] * cfg["BLOCK_K"]) == 0, (n, k, cfg)
