"""y = x W^T for a decode batch's rows on tensor cores, K split across programs (LinearBase.forward
at 2..256 rows, where linear() sends shapes whose cuBLAS tiles leave SMs idle: narrow N, wide K).

Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K). Each program multiplies one BLOCK_M x BLOCK_N
tile over its slice of K with tl.dot; one slice stores its tile directly, else it writes an fp32
partial and the last program of the tile to arrive (an arrival counter, as decode_attention's merge)
sums the partials in slice order and stores y. The sum order is fixed, so results repeat bit for bit.
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.arrival import arrival_counters
from nanoserve.worker.kernels.dtypes import dot_dtype
from nanoserve.worker.kernels.pdl import pdl_launch, pdl_wait

MAX_M = 256

# (N, K) -> [(largest M, config), ...] by rising M: the tile and split count linear() uses for a
# decode batch of M rows, from nanoserve.benchmarks.gemm_split_k's L2-cold sweep on the H200
# (docs/benchmarks.md). None, a shape not listed, or M past the last entry: cuBLAS.
CONFIGS: dict[tuple[int, int], list[tuple[int, dict | None]]] = {}


def _tile(bm: int, split: int) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=32, BLOCK_K=128, SPLIT_K=split, num_warps=4, num_stages=4)


# 2026-12-01 sweep (H200, 13dd0c2), µs against cuBLAS: Qwen3-0.6B's o_proj (1024 x 2048) M=16 4.95
# vs 5.82, M=32 5.51 vs 5.84; down_proj (1024 x 3072) M=16 5.65 vs 6.90, M=32 6.21 vs 7.00, M=64
# 6.68 vs 7.21. cuBLAS wins at every other M swept and for qkv and gate_up (N 4096, 6144).
CONFIGS[(1024, 2048)] = [(16, _tile(16, 4)), (32, _tile(32, 4))]
CONFIGS[(1024, 3072)] = [(16, _tile(16, 4)), (32, _tile(32, 4)), (48, None), (64, _tile(64, 4))]


def split_k_config(m: int, n: int, k: int) -> dict | None:
    """The config for an (m, k) x (k, n) product from CONFIGS: the first entry whose M reaches m
    (None: cuBLAS)."""
    for max_m, config in CONFIGS.get((n, k), ()):
        if m <= max_m:
            return config
    return None


@triton.jit
def _split_k_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    part_ptr,
    counters_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_slice,  # K / SPLIT_K, a multiple of BLOCK_K (split_k_gemm checks)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # x's dtype, fp32 for bf16 under the CPU interpreter (dtypes.py)
    PDL: tl.constexpr,  # worker.kernels.pdl: wait for the previous kernel first
):
    pdl_wait(PDL)
    # the split count and slice length are run-time values: one compiled kernel a tile shape
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    split_k = tl.num_programs(2)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # rows past M / N re-read the last one instead of being masked: never stored
    x_rows = tl.minimum(ms, M - 1).to(tl.int64)
    w_rows = tl.minimum(ns, N - 1).to(tl.int64)
    k0 = split * k_slice
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + (k0 + ks)[None, :]  # (BM, BK)
    w_ptrs = w_ptr + w_rows[:, None] * stride_wn + (k0 + ks)[None, :]  # (BN, BK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, k_slice, BLOCK_K):
        acc = tl.dot(tl.load(x_ptrs).to(DOT_DTYPE), tl.trans(tl.load(w_ptrs).to(DOT_DTYPE)), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_mask = (ms < M)[:, None] & (ns < N)[None, :]
    y_ptrs = y_ptr + ms[:, None] * stride_ym + ns[None, :]
    if split_k == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partials (split_k, M_pad, N_pad) fp32, M_pad / N_pad whole tiles: no masks needed
        n_pad = tl.num_programs(1) * BLOCK_N
        m_pad = tl.num_programs(0) * BLOCK_M
        tile = ms[:, None] * n_pad + ns[None, :]
        tl.store(part_ptr + split * m_pad * n_pad + tile, acc)
        # the barrier orders every thread's partial store before the gpu-scope release of the
        # counter add; the last of the split_k programs of this tile sums them
        tl.debug_barrier()
        counter = counters_ptr + pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for j in range(split_k):  # slice order: the same sum on every run
                # ".cg" reads at L2: other programs' partials may be stale in this SM's L1
                total += tl.load(part_ptr + j * m_pad * n_pad + tile, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.store(counter, 0)  # zero for the next launch / graph replay


def split_k_gemm(x: torch.Tensor, weight: torch.Tensor, config: dict) -> torch.Tensor:
    """x: (M, K) with M <= MAX_M; weight: (N, K) row-major -> (M, N) in x's dtype. config:
    BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages; K must be a multiple of
    SPLIT_K * BLOCK_K (linear() sends only such shapes)."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"split_k_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be 2-D"
        )
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if m > MAX_M or x.shape[1] != k:
        raise ValueError(f"split_k_gemm: x {tuple(x.shape)} does not fit weight {(n, k)}")
    if weight.stride(1) != 1 or x.stride(1) != 1 or x.dtype != weight.dtype:
        raise ValueError("split_k_gemm: x and weight need contiguous rows and one dtype")
    split, bk = config["SPLIT_K"], config["BLOCK_K"]
    if k % (split * bk):
        raise ValueError(f"split_k_gemm: K={k} is not a multiple of SPLIT_K * BLOCK_K in {config}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    if split > 1:
        part = torch.empty(split, grid[0] * bm, grid[1] * bn, dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[1], "split_k_gemm")
    else:
        part, counters = y, y  # unused with one slice
    _split_k_gemm_kernel[grid](
        x,
        weight,
        y,
        part,
        counters,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        k // split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        DOT_DTYPE=dot_dtype(x.dtype),
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
        **pdl_launch(x),
    )
    return y
