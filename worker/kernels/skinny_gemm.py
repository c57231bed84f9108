"""y = x W^T for the few rows of a decode batch (LinearBase.forward: one row, narrow W, on CUDA).

At M = 1 the GEMM is a matrix-vector product bound by reading W once from HBM. Each program streams
BLOCK_N whole rows of W through registers and reduces on the CUDA cores; the loop is software-
pipelined LOOP_STAGES deep so several W tiles are in flight per program. fp32 accumulation; the order
differs from cuBLAS (ulps, not bugs). Tiles come from shapes only (skinny_gemm_config), chosen by
nanoserve.benchmarks.gemm's L2-cold sweep (where splitting K never won: it is not implemented).
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.pdl import pdl_launch, pdl_wait

MAX_M = 8
# With K in one step, a program's W rows (weights: no kernel writes them) are loaded before the PDL
# wait, so their HBM latency overlaps the previous kernel's drain. Off until measured
# (`bench variants prefetch`); read at launch, each setting its own kernel.
PREFETCH_WEIGHTS = False


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    r_ptr,  # NORM: the residual added to x before the norm (HAS_RESIDUAL)
    nw_ptr,  # NORM: the RMSNorm's weight, (K,)
    r_out_ptr,  # NORM: x + residual, stored by program 0 (the next residual)
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_rm,
    stride_rom,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,  # K rounded up to whole BLOCK_K steps: a constant trip count
    LOOP_STAGES: tl.constexpr,
    GATED: tl.constexpr,  # y = silu(x W[:N]^T) * x W[N:2N]^T: the MLP's gate_up and its SiLU
    NORM: tl.constexpr,  # x is first RMS-normed (after the residual add): the norm before W
    HAS_RESIDUAL: tl.constexpr,
    EARLY_W: tl.constexpr,  # K in one step and PREFETCH_WEIGHTS: W loaded before the PDL wait
    PDL: tl.constexpr,  # worker.kernels.pdl: wait for the previous kernel first
):
    pid_n = tl.program_id(0)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output features of this program
    ms = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    # rows past N (and M) re-read the last one instead of being masked; they are never stored
    w_rows = tl.minimum(rows, N - 1).to(tl.int64)
    x_rows = tl.minimum(ms, M - 1)
    w_ptrs = w_ptr + w_rows[:, None] * stride_wn + ks[None, :]  # (BN, BK)
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + ks[None, :]  # (BM, BK)
    u_ptrs = w_ptrs + N * stride_wn  # GATED: the up rows, N past their gate rows
    r_ptrs = r_ptr + x_rows[:, None] * stride_rm + ks[None, :]  # (BM, BK)
    dtype = y_ptr.dtype.element_ty
    if EARLY_W:
        w_first = tl.load(w_ptrs, mask=(ks < K)[None, :], other=0.0)
        u_first = w_first
        if GATED:
            u_first = tl.load(u_ptrs, mask=(ks < K)[None, :], other=0.0)
    pdl_wait(PDL)  # nothing the previous kernel writes is read before it
    rstd = tl.zeros((BLOCK_M,), tl.float32)
    if NORM:  # each program takes the rows' statistics itself (x is a few KiB, from L2)
        sum_sq = tl.zeros((BLOCK_M,), tl.float32)
        store_mask = (ms < M)[:, None] & (pid_n == 0)
        for k in tl.range(0, K_CHUNK, BLOCK_K):
            k_mask = (k + ks) < K
            x = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                x += tl.load(r_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
                r_out = r_out_ptr + ms[:, None] * stride_rom + (k + ks)[None, :]
                tl.store(r_out, x.to(dtype), mask=store_mask & k_mask[None, :])
            sum_sq += tl.sum(x * x, axis=1)
        rstd = tl.rsqrt(sum_sq / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    # tl.range's num_stages (unlike the launch option) also pipelines loads that feed no tl.dot
    for k in tl.range(0, K_CHUNK, BLOCK_K, num_stages=LOOP_STAGES):
        k_mask = (k + ks) < K
        if EARLY_W:
            w = w_first
        else:
            w = tl.load(w_ptrs + k, mask=k_mask[None, :], other=0.0)
        x = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
        if NORM:  # as worker.kernels.norm: the fp32 sum normed, rounded, times the weight (the
            # sum taken again, from L1/L2: cheaper than holding all of K in registers)
            if HAS_RESIDUAL:
                x += tl.load(r_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            nw = tl.load(nw_ptr + k + ks, mask=k_mask, other=0.0).to(tl.float32)
            x = ((x * rstd[:, None]).to(dtype).to(tl.float32) * nw[None, :]).to(dtype)
            x = x.to(tl.float32)
        # (BM, 1, BK) * (1, BN, BK) summed over K: CUDA-core FMAs, W is read once
        acc += tl.sum(tl.expand_dims(x, 1) * tl.expand_dims(w.to(tl.float32), 0), axis=2)
        if GATED:
            if EARLY_W:
                u = u_first
            else:
                u = tl.load(u_ptrs + k, mask=k_mask[None, :], other=0.0)
            acc_up += tl.sum(tl.expand_dims(x, 1) * tl.expand_dims(u.to(tl.float32), 0), axis=2)
    if GATED:  # rounded to the output dtype first, as the unfused gate_up's output would be
        gate = acc.to(dtype).to(tl.float32)
        up = acc_up.to(dtype).to(tl.float32)
        acc = gate * tl.sigmoid(gate) * up
    out_mask = (ms < M)[:, None] & (rows < N)[None, :]
    tl.store(
        y_ptr + ms[:, None] * stride_ym + rows[None, :],
        acc.to(dtype),
        mask=out_mask,
    )


def skinny_gemm_config(m: int, n: int, k: int) -> dict:
    """Tile sizes from shapes only, never autotuned at run time (results reproduce run to run).

    M = 1: the best tiles of bench_gemm's L2-cold sweep on the H200 (8d06583+): narrow N (<= 2048)
    two rows of W a program, K in one 2048-wide step where it fits, else 512-wide steps pipelined
    3 deep; wider N four rows, 1024-wide steps pipelined 2 deep. M > 1 is a guess (linear() sends
    only M = 1 here).
    """
    block_m, k_pow2 = triton.next_power_of_2(max(m, 1)), triton.next_power_of_2(max(k, 1))
    if m == 1 and n <= 2048:
        if k <= 2048:
            return dict(
                BLOCK_M=1, BLOCK_N=2, BLOCK_K=k_pow2, LOOP_STAGES=1, num_warps=8, num_stages=1
            )
        return dict(BLOCK_M=1, BLOCK_N=2, BLOCK_K=512, LOOP_STAGES=3, num_warps=4, num_stages=1)
    block_n = 4 if m == 1 else max(1, 8 // block_m)
    block_k = min(1024 if m == 1 else 512, k_pow2)
    return dict(
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, LOOP_STAGES=2, num_warps=4, num_stages=1
    )


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, config: dict | None = None, gated: bool = False
) -> torch.Tensor:
    """x: (M, K) with M <= MAX_M; weight: (N, K) row-major -> (M, N) in x's dtype. gated: weight
    is the MLP's (2 I, K) [gate | up] -> silu(x gate^T) * (x up^T), (M, I), in one kernel (the
    same bytes per program as the (M, 2 I) GEMM: half as many rows of each)."""
    return _launch(x, weight, config, gated, None)[0]


def norm_skinny_gemm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    gated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RMSNorm before a linear layer and the layer in one kernel: (skinny_gemm(h, weight,
    gated=gated), x + residual) where h = norm.fused_add_rms_norm(x, residual, norm_weight, eps)
    (without a residual: h = rms_norm(x), and x is returned as the residual)."""
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"norm_skinny_gemm: residual {tuple(residual.shape)} must be x's shape")
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"norm_skinny_gemm: norm weight {tuple(norm_weight.shape)} != (K,)")
    return _launch(x, weight, None, gated, (residual, norm_weight, eps))


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: dict | None,
    gated: bool,
    norm: tuple[torch.Tensor | None, torch.Tensor, float] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, the next residual: x + residual under a norm, else x)."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"skinny_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be 2-D"
        )
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if m > MAX_M:
        raise ValueError(f"skinny_gemm: x has M={m} rows, the kernel takes M <= {MAX_M}")
    if x.shape[1] != k:
        raise ValueError(f"skinny_gemm: x width {x.shape[1]} must be weight's K={k}")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("skinny_gemm: x and weight need contiguous rows (stride(1) == 1)")
    if x.dtype != weight.dtype:
        raise ValueError(f"skinny_gemm: x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    if gated and n % 2:
        raise ValueError(f"skinny_gemm: a gated weight needs an even N (gate, up), got N={n}")
    cfg = {"LOOP_STAGES": 1, "num_stages": 1, **(config or skinny_gemm_config(m, n, k))}
    if cfg["BLOCK_M"] < m:
        raise ValueError(f"skinny_gemm: config {cfg} needs BLOCK_M >= M={m}")
    if gated:  # each program reads BLOCK_N gate rows and as many up rows
        n //= 2
        cfg["BLOCK_N"] = max(1, cfg["BLOCK_N"] // 2) if config is None else cfg["BLOCK_N"]
    residual, norm_weight, eps = norm if norm is not None else (None, weight, 0.0)
    # a new tensor: program 0 writes it while the others still read x and residual
    r_out = torch.empty_like(x) if residual is not None else x
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        return y.zero_(), r_out
    cfg["K_CHUNK"] = triton.cdiv(k, cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    r_in = residual if residual is not None else x
    _skinny_gemm_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x,
        weight,
        y,
        r_in,
        norm_weight,
        r_out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        r_in.stride(0),
        r_out.stride(0),
        eps,
        GATED=gated,
        EARLY_W=PREFETCH_WEIGHTS and cfg["K_CHUNK"] == cfg["BLOCK_K"],
        NORM=norm is not None,
        HAS_RESIDUAL=residual is not None,
        **cfg,
        **pdl_launch(x),
    )
    return y, r_out
