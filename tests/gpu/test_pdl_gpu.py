"""Programmatic dependent launch changes when a kernel starts, never what it computes: a CUDA graph
of the decode step's Triton kernels back to back gives the same bits with and without it."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _chain(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, gate_up: torch.Tensor):
    from nanoserve.worker.kernels.norm import fused_add_rms_norm, silu_and_mul

    for _ in range(8):  # each kernel reads what the one before it wrote
        x, residual = fused_add_rms_norm(x, residual, w, 1e-6)
        y = silu_and_mul(torch.cat([x, x], dim=1) * gate_up)
        x = fused_add_rms_norm(y, residual, w, 1e-6)[0]
    return x, residual


@pytest.mark.parametrize("rows", [1, 16, 256])
def test_graph_with_pdl_equals_graph_without(rows, monkeypatch):
    from nanoserve.worker.kernels import pdl

    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(rows)
    x = torch.randn(rows, 1024, device=dev, generator=gen).bfloat16()
    residual = torch.randn(rows, 1024, device=dev, generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(1024, device=dev, generator=gen)).bfloat16()
    gate_up = torch.randn(rows, 2048, device=dev, generator=gen).bfloat16()
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("NANOSERVE_PDL", flag)
        pdl._enabled.cache_clear()
        assert pdl.pdl_launch(x)["PDL"] is (flag == "1")
        _chain(x, residual, w, gate_up)  # compile
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(x, residual, w, gate_up)
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        outs.append([t.clone() for t in out])
    pdl._enabled.cache_clear()
    assert all(torch.equal(a, b) for a, b in zip(*outs))
