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


# what the kernel does to its input rows before the product (PROLOGUE): nothing; silu(gate) * up
# of a [gate | up] row twice K wide (the MLP's activation); or RMSNorm(x + residual) of a row that
# fits one K step, storing x + residual too (the decoder layer's add + norm). Each program redoes
# the prologue on the rows it reads (a few KB from L2): the kernel it replaces cost a launch.
PLAIN, SILU_AND_MUL, ADD_RMS_NORM = 0, 1, 2


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    residual_ptr,  # ADD_RMS_NORM: the residual stream (M, K) and where x + residual goes
    new_residual_ptr,
    norm_w_ptr,  # ADD_RMS_NORM: the norm's weight (K,)
    eps,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,  # K rounded up to whole BLOCK_K steps: a constant trip count
    LOOP_STAGES: tl.constexpr,
    PROLOGUE: tl.constexpr,
    PDL: tl.constexpr,  # worker.kernels.pdl: wait for the previous kernel first
):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output features of this program
    ms = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    # rows past N (and M) re-read the last one instead of being masked; they are never stored
    w_rows = tl.minimum(rows, N - 1).to(tl.int64)
    x_rows = tl.minimum(ms, M - 1)
    w_ptrs = w_ptr + w_rows[:, None] * stride_wn + ks[None, :]  # (BN, BK)
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + ks[None, :]  # (BM, BK)
    dtype = w_ptr.dtype.element_ty
    if PROLOGUE == 2:  # K <= BLOCK_K: the whole row is one step, normalised once here
        # the same arithmetic as worker.kernels.norm's fused_add_rms_norm
        k_mask = ks < K
        nw = tl.load(norm_w_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)
        r_ptrs = residual_ptr + x_rows[:, None] * K + ks[None, :]
        h = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0).to(tl.float32)
        h += tl.load(r_ptrs, mask=k_mask[None, :], other=0.0).to(tl.float32)
        if pid_n == 0:
            out_ptrs = new_residual_ptr + ms[:, None] * K + ks[None, :]
            tl.store(out_ptrs, h.to(dtype), mask=(ms < M)[:, None] & k_mask[None, :])
        rstd = tl.rsqrt(tl.sum(h * h, 1) / K + eps)  # (BM,)
        normed = ((h * rstd[:, None]).to(dtype).to(tl.float32) * nw[None, :]).to(dtype)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    # tl.range's num_stages (unlike the launch option) also pipelines loads that feed no tl.dot
    for k in tl.range(0, K_CHUNK, BLOCK_K, num_stages=LOOP_STAGES):
        k_mask = (k + ks) < K
        w = tl.load(w_ptrs + k, mask=k_mask[None, :], other=0.0)
        if PROLOGUE == 2:
            x = normed
        elif PROLOGUE == 1:  # x_ptr rows are [gate | up]; as worker.kernels.norm's silu_and_mul
            gate = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            up = tl.load(x_ptrs + K + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            x = (gate * tl.sigmoid(gate) * up).to(dtype)
        else:
            x = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0)
        # (BM, 1, BK) * (1, BN, BK) summed over K: CUDA-core FMAs, W is read once
        acc += tl.sum(
            tl.expand_dims(x.to(tl.float32), 1) * tl.expand_dims(w.to(tl.float32), 0), axis=2
        )
    out_mask = (ms < M)[:, None] & (rows < N)[None, :]
    tl.store(
        y_ptr + ms[:, None] * stride_ym + rows[None, :],
        acc.to(y_ptr.dtype.element_ty),
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
    x: torch.Tensor, weight: torch.Tensor, config: dict | None = None, silu_and_mul: bool = False
) -> torch.Tensor:
    """x: (M, K) with M <= MAX_M; weight: (N, K) row-major -> (M, N) in x's dtype.
    silu_and_mul: x is (M, 2K), [gate | up] (the fused gate_up projection), and the product is
    silu(gate) * up @ W^T, the MLP's activation done as the rows are read."""
    return _launch(x, weight, config, SILU_AND_MUL if silu_and_mul else PLAIN, None, None, 0.0)[0]


def skinny_add_rms_norm_gemm(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) @ W^T, x + residual) for a row of at most 2048 features: one launch
    where fused_add_rms_norm and the GEMM took two."""
    y, new_residual = _launch(x, weight, config, ADD_RMS_NORM, residual, norm_weight, eps)
    assert new_residual is not None
    return y, new_residual


def fits_add_rms_norm(k: int) -> bool:
    """Whether skinny_add_rms_norm_gemm takes rows of k features (one K step of its tiles)."""
    return k <= 2048


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: dict | None,
    prologue: int,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"skinny_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be 2-D"
        )
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if m > MAX_M:
        raise ValueError(f"skinny_gemm: x has M={m} rows, the kernel takes M <= {MAX_M}")
    width = 2 * k if prologue == SILU_AND_MUL else k
    if x.shape[1] != width:
        raise ValueError(f"skinny_gemm: x width {x.shape[1]} must be {width} (weight's K={k})")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("skinny_gemm: x and weight need contiguous rows (stride(1) == 1)")
    if x.dtype != weight.dtype:
        raise ValueError(f"skinny_gemm: x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    cfg = {"LOOP_STAGES": 1, "num_stages": 1, **(config or skinny_gemm_config(m, n, k))}
    new_residual = None
    if prologue == ADD_RMS_NORM:
        if not fits_add_rms_norm(k) or residual is None or norm_weight is None:
            raise ValueError(
                f"skinny_gemm: add + RMSNorm needs a residual, a norm and K={k} <= 2048"
            )
        if residual.shape != x.shape or not residual.is_contiguous():
            raise ValueError(
                f"skinny_gemm: residual {tuple(residual.shape)} must be x's, contiguous"
            )
        cfg["BLOCK_K"] = triton.next_power_of_2(k)  # the whole row in one step
        new_residual = torch.empty_like(residual)
    if cfg["BLOCK_M"] < m:
        raise ValueError(f"skinny_gemm: config {cfg} needs BLOCK_M >= M={m}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        return y.zero_(), new_residual
    cfg["K_CHUNK"] = triton.cdiv(k, cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    _skinny_gemm_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x,
        weight,
        y,
        x if residual is None else residual,
        x if new_residual is None else new_residual,
        x if norm_weight is None else norm_weight,
        eps,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        **cfg,
        PROLOGUE=prologue,
        **pdl_launch(x),
    )
    return y, new_residual
