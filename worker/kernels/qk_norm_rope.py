"""Qwen3's per-head q/k RMSNorm followed by the rotary embedding, in place, in one kernel.

Replaces ~30 small torch kernels a layer (two norms, the cos/sin gather, rotate-half) on the decode
path, where launch count, not bytes, sets the time. Called by Qwen3Attention on CUDA tensors.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_sin_ptr, pos_ptr,
                         stride_qt, stride_qh, stride_kt, stride_kh, eps,
                         NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < NUM_Q_HEADS:
        ptr = q_ptr + token * stride_qt + head * stride_qh
        w_ptr = qw_ptr
    else:
        ptr = k_ptr + token * stride_kt + (head - NUM_Q_HEADS) * stride_kh
        w_ptr = kw_ptr
    dims = tl.arange(0, HALF)
    x1 = tl.load(ptr + dims).to(tl.float32)
    x2 = tl.load(ptr + HALF + dims).to(tl.float32)
    # RMSNorm over head_dim in fp32, rounded to the activation dtype before the weight (as the
    # torch RMSNorm), then the rotary rotation of the (first half, second half) pairs in fp32
    rstd = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
    dtype = q_ptr.dtype.element_ty
    x1 = (x1 * rstd).to(dtype).to(tl.float32) * tl.load(w_ptr + dims).to(tl.float32)
    x2 = (x2 * rstd).to(dtype).to(tl.float32) * tl.load(w_ptr + HALF + dims).to(tl.float32)
    x1 = x1.to(dtype).to(tl.float32)
    x2 = x2.to(dtype).to(tl.float32)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * (2 * HALF) + dims)
    sin = tl.load(cos_sin_ptr + pos * (2 * HALF) + HALF + dims)
    tl.store(ptr + dims, (x1 * cos - x2 * sin).to(dtype))
    tl.store(ptr + HALF + dims, (x2 * cos + x1 * sin).to(dtype))


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos_sin_cache: torch.Tensor, positions: torch.Tensor, eps: float) -> None:
    """In place. q: (N, Hq, D), k: (N, Hkv, D) (strided views of the qkv output are fine);
    cos_sin_cache: (max_position, D) fp32 as [cos | sin]; positions: (N,)."""
    n, num_q_heads, head_dim = q.shape
    if k.shape[0] != n or k.shape[2] != head_dim or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} do not fit")
    if n == 0:
        return
    _qk_norm_rope_kernel[(n, num_q_heads + k.shape[1])](
        q, k, q_weight, k_weight, cos_sin_cache, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), eps,
        NUM_Q_HEADS=num_q_heads, HALF=head_dim // 2, num_warps=1)
