"""worker.kernels.split_k_gemm on CUDA at the shapes and M its table sends it (bf16, Qwen3-0.6B
o_proj and down_proj): close to cuBLAS, bit-repeatable, and the same inside a CUDA graph."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def table_cases() -> list[tuple[int, int, int]]:
    from nanoserve.worker.kernels.split_k_gemm import CONFIGS

    return [(m, n, k) for (n, k), rows in CONFIGS.items() for m, cfg in rows if cfg is not None]


@pytest.mark.parametrize("m, n, k", table_cases())
def test_table_entries_match_cublas(m, n, k):
    from nanoserve.worker.kernels.split_k_gemm import split_k_config
    from nanoserve.worker.layers.linear import linear

    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    for rows in (m, m - 5):  # the bucket's M, and fewer rows in the same entry
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
        assert split_k_config(rows, n, k) is not None
        y = linear(x, w, None)
        ref = F.linear(x.float(), w.float())
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
        assert torch.equal(linear(x, w, None), y)  # fixed sum order


def test_table_entry_replays_in_a_cuda_graph():
    from nanoserve.worker.layers.linear import linear

    m, n, k = table_cases()[0]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    eager = linear(x, w, None)  # sizes the arrival counters outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear(x, w, None)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, linear(x, w, None))
    assert not torch.equal(out, eager)
