"""y = x W^T for the few rows of a decode batch (LinearBase.forward: one row, narrow W, on CUDA).

At M = 1 the GEMM is a matrix-vector product bound by reading W once. cuBLAS picks tensor-core
tiles that take 10.2 µs for Qwen3-0.6B's o_proj (1024 x 2048) where this kernel takes 3.4 µs
(H200, worker.kernels.bench_gemm): each program streams BLOCK_N whole rows of W through registers
and reduces on the CUDA cores, with N / BLOCK_N programs covering every SM. fp32 accumulation; the
order differs from cuBLAS (ulps, not bugs). M > 1 works but is slower than cuBLAS.
"""
import torch
import triton
import triton.language as tl

MAX_M = 8


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_ym,
    K: tl.constexpr,  # a compile-time constant: a model has a handful of widths
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features of this program
    ms = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < N
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    x_ptrs = x_ptr + ms[:, None] * stride_xm + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = (k + ks) < K
        w = tl.load(w_ptrs + k, mask=row_mask[:, None] & k_mask[None, :], other=0.0)  # (BN, BK)
        x = tl.load(x_ptrs + k, mask=(ms < M)[:, None] & k_mask[None, :], other=0.0)  # (BM, BK)
        # (BM, 1, BK) * (1, BN, BK) summed over K: CUDA-core FMAs, W is read once
        acc += tl.sum(tl.expand_dims(x.to(tl.float32), 1) * tl.expand_dims(w.to(tl.float32), 0), axis=2)
    y_ptrs = y_ptr + ms[:, None] * stride_ym + rows[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(ms < M)[:, None] & row_mask[None, :])


def skinny_gemm_config(m: int, n: int, k: int) -> dict:
    """Tile sizes from shapes only: the best of worker.kernels.bench_gemm's sweep on the H200 for
    M = 1 (two rows of W a program, 512-wide K steps), and bounded registers for larger M."""
    block_m = triton.next_power_of_2(m)
    block_n = 2 if m == 1 else 4
    block_k = min(512, triton.next_power_of_2(k), max(64, 4096 // (block_m * block_n)))
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                num_warps=2 if k <= 2048 else 4, num_stages=3)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """x: (M, K) with M <= MAX_M, weight: (N, K) row-major -> (M, N) in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_M or weight.shape[1] != k or weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} "
                         f"need M <= {MAX_M}, a shared K and contiguous rows")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    cfg = config or skinny_gemm_config(m, n, k)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]),)
    _skinny_gemm_kernel[grid](x, weight, y, m, n, x.stride(0), weight.stride(0), y.stride(0), K=k,
                              **cfg)
    return y
