"""y = x W^T for the few rows of a decode batch (LinearBase.forward: one row, narrow W, on CUDA).

At M = 1 the GEMM is a matrix-vector product bound by reading W once from HBM. Each program streams
BLOCK_N whole rows of W (or a K chunk of them, SPLIT_K > 1) through registers and reduces on the CUDA
cores; the loop is software-pipelined LOOP_STAGES deep so several W tiles are in flight per program.
fp32 accumulation; the order differs from cuBLAS (ulps, not bugs). Tiles come from shapes only
(skinny_gemm_config), chosen by nanoserve.benchmarks.gemm's L2-cold sweep.
"""
import torch
import triton
import triton.language as tl

MAX_M = 8
MAX_SPLIT_K = 16

# device -> int32 arrival counters (one per column tile of a SPLIT_K > 1 launch), the newest last; all
# zero between launches because the merging program resets its own. Older buffers stay alive: a CUDA
# graph captured with one replays it. Launches sharing a buffer must not overlap in time, which holds
# because the engine runs every decode kernel of a device on one stream.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


@triton.jit
def _skinny_gemm_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,  # K columns per split, a multiple of BLOCK_K (a constant trip count)
    SPLIT_K: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    SILU_AND_MUL: tl.constexpr,  # x is (M, 2K) = [gate | up]; multiply W by silu(gate) * up
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output features of this program
    ms = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    # rows past N (and M) re-read the last one instead of being masked; they are never stored
    w_rows = tl.minimum(rows, N - 1).to(tl.int64)
    x_rows = tl.minimum(ms, M - 1)
    k_start = pid_k * K_CHUNK
    w_ptrs = w_ptr + w_rows[:, None] * stride_wn + (k_start + ks)[None, :]  # (BN, BK)
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + (k_start + ks)[None, :]  # (BM, BK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    # tl.range's num_stages (unlike the launch option) also pipelines loads that feed no tl.dot
    for k in tl.range(0, K_CHUNK, BLOCK_K, num_stages=LOOP_STAGES):
        k_mask = (k_start + k + ks) < K  # the last split may run past K
        w = tl.load(w_ptrs + k, mask=k_mask[None, :], other=0.0)
        if SILU_AND_MUL:
            gate = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            up = tl.load(x_ptrs + K + k, mask=k_mask[None, :], other=0.0).to(tl.float32)
            # rounded to x's dtype as worker.kernels.norm.silu_and_mul stores it
            x = (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty)
        else:
            x = tl.load(x_ptrs + k, mask=k_mask[None, :], other=0.0)
        # (BM, 1, BK) * (1, BN, BK) summed over K: CUDA-core FMAs, W is read once
        acc += tl.sum(tl.expand_dims(x.to(tl.float32), 1) * tl.expand_dims(w.to(tl.float32), 0), axis=2)
    out_mask = (ms < M)[:, None] & (rows < N)[None, :]
    y_ptrs = y_ptr + ms[:, None] * stride_ym + rows[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partials: (SPLIT_K, M, N) fp32. Every thread's stores precede the barrier, the barrier the
        # single-thread gpu-scope release of the counter add, so the program that acquires the last
        # count sees all SPLIT_K partials and sums them in split order: arrival order never matters.
        part_ptrs = part_ptr + ms[:, None] * N + rows[None, :]
        tl.store(part_ptrs + pid_k * M * N, acc, mask=out_mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(counters_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for s in tl.static_range(SPLIT_K):
                # ".cg" reads at L2: another program's partial may be stale in this SM's L1
                total += tl.load(part_ptrs + s * M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.store(counters_ptr + pid_n, 0)  # every split has arrived: zero for the next launch


def _arrival_counters(device: torch.device, size: int) -> torch.Tensor:
    """A zeroed int32 buffer of >= size counters that persists across calls and graph replays; grows
    only outside CUDA-graph capture (the engine's eager warm-up runs every decode shape first)."""
    buffers = _COUNTERS.setdefault(device, [])
    if buffers and buffers[-1].numel() >= size:
        return buffers[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"skinny_gemm: capturing a CUDA graph needs {size} arrival counters on "
                           f"{device}; run the same shape eagerly before capture")
    buffers.append(torch.zeros(max(size, 4096), dtype=torch.int32, device=device))
    return buffers[-1]


def skinny_gemm_config(m: int, n: int, k: int) -> dict:
    """Tile sizes from shapes only, never autotuned at run time (results reproduce run to run).

    M = 1: the best tiles of bench_gemm's L2-cold sweep on the H200 (8d06583+): narrow N (<= 2048)
    two rows of W a program, K in one 2048-wide step where it fits, else 512-wide steps pipelined
    3 deep; wider N four rows, 1024-wide steps pipelined 2 deep, no K split (a split never won).
    M > 1 is a guess (linear() sends only M = 1 here).
    """
    block_m, k_pow2 = triton.next_power_of_2(max(m, 1)), triton.next_power_of_2(max(k, 1))
    if m == 1 and n <= 2048:
        if k <= 2048:
            return dict(BLOCK_M=1, BLOCK_N=2, BLOCK_K=k_pow2, SPLIT_K=1, LOOP_STAGES=1,
                        num_warps=8, num_stages=1)
        return dict(BLOCK_M=1, BLOCK_N=2, BLOCK_K=512, SPLIT_K=1, LOOP_STAGES=3, num_warps=4,
                    num_stages=1)
    block_n = 4 if m == 1 else max(1, 8 // block_m)
    block_k = min(1024 if m == 1 else 512, k_pow2)
    tiles = triton.cdiv(n, block_n)
    split_k = 1
    while split_k < 8 and tiles * split_k < 528 and k // (2 * split_k) >= block_k:
        split_k *= 2
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, LOOP_STAGES=2,
                num_warps=4, num_stages=1)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, config: dict | None = None,
                silu_and_mul: bool = False) -> torch.Tensor:
    """x: (M, K) with M <= MAX_M, or (M, 2K) = [gate | up] with silu_and_mul (the fused gate_up_proj
    output: then y = silu_and_mul(x) W^T without the intermediate); weight: (N, K) row-major -> (M, N)
    in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be 2-D")
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    width = 2 * k if silu_and_mul else k
    if m > MAX_M:
        raise ValueError(f"skinny_gemm: x has M={m} rows, the kernel takes M <= {MAX_M}")
    if x.shape[1] != width:
        raise ValueError(f"skinny_gemm: x width {x.shape[1]} must be weight's K={k}"
                         + (" times 2 ([gate | up]) with silu_and_mul" if silu_and_mul else ""))
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("skinny_gemm: x and weight need contiguous rows (stride(1) == 1)")
    if x.dtype != weight.dtype:
        raise ValueError(f"skinny_gemm: x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    cfg = {"SPLIT_K": 1, "LOOP_STAGES": 1, "num_stages": 1, **(config or skinny_gemm_config(m, n, k))}
    if cfg["BLOCK_M"] < m or not 1 <= cfg["SPLIT_K"] <= MAX_SPLIT_K:
        raise ValueError(f"skinny_gemm: config {cfg} needs BLOCK_M >= M={m} and "
                         f"1 <= SPLIT_K <= {MAX_SPLIT_K}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        return y.zero_()
    # split K into whole BLOCK_K steps; a short K may use fewer splits than asked
    cfg["K_CHUNK"] = triton.cdiv(triton.cdiv(k, cfg["SPLIT_K"]), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    cfg["SPLIT_K"] = triton.cdiv(k, cfg["K_CHUNK"])
    tiles = triton.cdiv(n, cfg["BLOCK_N"])
    if cfg["SPLIT_K"] > 1:
        part = torch.empty(cfg["SPLIT_K"], m, n, dtype=torch.float32, device=x.device)
        counters = _arrival_counters(x.device, tiles)
    else:
        part = counters = y  # unused by the SPLIT_K == 1 specialisation
    _skinny_gemm_kernel[(tiles, cfg["SPLIT_K"])](
        x, weight, y, part, counters, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        SILU_AND_MUL=silu_and_mul, **cfg)
    return y
