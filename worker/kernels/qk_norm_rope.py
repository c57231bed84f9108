"""Qwen3's per-head q/k RMSNorm followed by the rotary embedding, in place, in one kernel; optionally
also the KV-cache store of this step's k and v (Qwen3Attention, before Attention.forward).

Replaces ~30 small torch kernels a layer (two norms, the cos/sin gather, rotate-half, store_kvcache)
on the decode path, where launch count, not bytes, sets the time. Called on CUDA tensors. Its math
(head_rms, norm_weight, rotate) is shared with the decode attention, which does the same inside it.
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.pdl import pdl_launch, pdl_wait

ROWS_PER_PROGRAM = 16


# A token's q and k must have the same bits whichever kernel normalises them (this one in prefill
# and mixed steps, the decode attention's prologue in decode steps): a prefix cached by one step and
# recomputed by another must attend alike. So the math below is free of layout: the sum of squares
# in fp64 (the squares of 16-bit values are exact and so, for any realistic spread of a head's
# values, is their sum: the order of the reduction cannot change it) and the rotation's multiply-add
# spelled out (no contraction left to the compiler).
@triton.jit
def head_rms(sum_sq, HEAD_DIM: tl.constexpr, eps):
    """1 / RMS of a head from its fp64 sum of squares, in fp32."""
    return tl.rsqrt((sum_sq / HEAD_DIM).to(tl.float32) + eps)


@triton.jit
def norm_weight(x, rstd, w, dtype: tl.constexpr):
    """RMSNorm's scale in fp32, rounded to the activation dtype before and after the weight (as
    the torch RMSNorm)."""
    x = (x * rstd).to(dtype).to(tl.float32) * w
    return x.to(dtype).to(tl.float32)


@triton.jit
def rotate(x, partner, cos, sin, sign):
    """Rotary: x * cos + sign * partner * sin (sign -1 for the first half, whose partner is the
    second half, +1 for the second), one explicit fused multiply-add."""
    return tl.fma(x, cos, sign * (partner * sin))


@triton.jit
def norm_rope_rows(rows, mask, w_ptr, cos_sin_ptr, pos, eps, HEAD_DIM: tl.constexpr, dtype):
    """Whole heads (R, HEAD_DIM) of one token at position pos, normalised and rotated in dtype:
    the kernel below's math on full rows (the decode attention's prologue). rows: (R, 1) pointers
    to each head's first dim, mask (R, 1); a dim's rotary partner (+- HEAD_DIM / 2) is read a
    second time (from L1)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dims = tl.arange(0, HEAD_DIM)[None, :]
    partner = (dims + HALF) % HEAD_DIM
    x = tl.load(rows + dims, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner, mask=mask, other=0.0).to(tl.float32)
    xd = x.to(tl.float64)
    rstd = head_rms(tl.sum(xd * xd, 1), HEAD_DIM, eps)[:, None]
    x = norm_weight(x, rstd, tl.load(w_ptr + dims).to(tl.float32), dtype)
    xp = norm_weight(xp, rstd, tl.load(w_ptr + partner).to(tl.float32), dtype)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + dims % HALF)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HALF + dims % HALF)
    return rotate(x, xp, cos, sin, tl.where(dims < HALF, -1.0, 1.0)).to(dtype)


# positions and slot_mapping are views into a step's flat input message at offsets set by its token
# count: their 16-byte alignment varies per step, and so does the token count. Alignment buys
# nothing here and is not specialised on (an odd token count compiled a new kernel).
@triton.jit(
    do_not_specialize=["num_tokens"],
    do_not_specialize_on_alignment=["pos_ptr", "slot_mapping_ptr"],
)
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_sin_ptr,
    pos_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_tokens,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    eps,
    k_scale,
    v_scale,
    NUM_Q_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    STORE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr,  # worker.kernels.pdl: wait for the previous kernel first
):
    pdl_wait(PDL)
    # grid (cdiv(num_tokens, ROWS), num_q_heads + num_kv_heads): ROWS tokens x one head a program.
    # One token a program launched ~400k programs for a 16k-token prefill step (239 µs a layer
    # against a 62 µs bound). ROWS is the same for every step, decode and prefill: a token's q and
    # k must not depend on the step that carries it (a row's sum rounds by the tile's layout).
    tokens = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (R,)
    live = tokens < num_tokens
    head = tl.program_id(1)
    is_k = head >= NUM_Q_HEADS
    if head < NUM_Q_HEADS:
        ptr = q_ptr + tokens * stride_qt + head * stride_qh
        w_ptr = qw_ptr
    else:
        ptr = k_ptr + tokens * stride_kt + (head - NUM_Q_HEADS) * stride_kh
        w_ptr = kw_ptr
    dims = tl.arange(0, HALF)[None, :]
    ptr = ptr[:, None]  # (R, 1)
    # Every load is issued before the first store: a load after a store may alias it and waits
    # for it, and the v / slot reads after the in-place stores cost this latency-bound launch a
    # second memory round trip. Only the k heads' programs read v and the slots (masks).
    pos = tl.load(pos_ptr + tokens, mask=live, other=0).to(tl.int64)[:, None]
    if STORE:
        slot = tl.load(slot_mapping_ptr + tokens, mask=live & is_k, other=-1).to(tl.int64)
        keep = (slot >= 0)[:, None]
        kv_head = head - NUM_Q_HEADS
        src = v_ptr + (tokens * stride_vt + kv_head * stride_vh)[:, None]
        v1 = tl.load(src + dims, mask=keep, other=0.0).to(tl.float32)
        v2 = tl.load(src + HALF + dims, mask=keep, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + dims).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + dims).to(tl.float32)
    x1 = tl.load(ptr + dims, mask=live[:, None], other=0.0).to(tl.float32)  # (R, HALF)
    x2 = tl.load(ptr + HALF + dims, mask=live[:, None], other=0.0).to(tl.float32)
    cos = tl.load(cos_sin_ptr + pos * (2 * HALF) + dims)
    sin = tl.load(cos_sin_ptr + pos * (2 * HALF) + HALF + dims)
    # RMSNorm over head_dim, then the rotary rotation of the (first half, second half) pairs in
    # fp32
    x1d, x2d = x1.to(tl.float64), x2.to(tl.float64)
    rstd = head_rms(tl.sum(x1d * x1d, 1) + tl.sum(x2d * x2d, 1), 2 * HALF, eps)[:, None]
    dtype = q_ptr.dtype.element_ty
    x1 = norm_weight(x1, rstd, w1, dtype)
    x2 = norm_weight(x2, rstd, w2, dtype)
    y1 = rotate(x1, x2, cos, sin, -1.0).to(dtype)
    y2 = rotate(x2, x1, cos, sin, 1.0).to(dtype)
    tl.store(ptr + dims, y1, mask=live[:, None])
    tl.store(ptr + HALF + dims, y2, mask=live[:, None])
    if STORE:
        # the k head's program also writes the cache slots of its tokens (k and the same head of
        # v); slot -1 (a padded token of a CUDA graph, or any token of a q head's program) stores
        # nothing
        dst = (
            (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
        ) + kv_head * stride_ch
        dst = dst[:, None]
        cache_dtype = k_cache_ptr.dtype.element_ty
        # the cache holds k / k_scale, v / v_scale (fp8; scales of 1.0 change no bit)
        k1 = (y1.to(tl.float32) / k_scale).to(cache_dtype)
        k2 = (y2.to(tl.float32) / k_scale).to(cache_dtype)
        tl.store(k_cache_ptr + dst + dims, k1, mask=keep)
        tl.store(k_cache_ptr + dst + HALF + dims, k2, mask=keep)
        tl.store(v_cache_ptr + dst + dims, (v1 / v_scale).to(cache_dtype), mask=keep)
        tl.store(v_cache_ptr + dst + HALF + dims, (v2 / v_scale).to(cache_dtype), mask=keep)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    v: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    rows_per_program: int = ROWS_PER_PROGRAM,
) -> None:
    """In place. q: (N, Hq, D), k: (N, Hkv, D) (strided views of the qkv output are fine);
    cos_sin_cache: (max_position, D) fp32 as [cos | sin]; positions: (N,).

    With v (N, Hkv, D), k_cache/v_cache (num_blocks, block_size, Hkv, D) and slot_mapping (N,) int32
    or int64, also stores the normed, rotated k and the untouched v at each token's slot (as
    store_kvcache would afterwards); slot -1 stores nothing. All four or none. The cache holds
    k / k_scale and v / v_scale (an fp8 cache; 1.0 otherwise). rows_per_program: tokens a program
    normalises (a power of two; the engine always uses ROWS_PER_PROGRAM).
    """
    n, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if k.shape[0] != n or k.shape[2] != head_dim or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} do not fit")
    store = [x is not None for x in (v, k_cache, v_cache, slot_mapping)]
    if any(store) and not all(store):
        raise ValueError("qk_norm_rope: v, k_cache, v_cache and slot_mapping come together")
    if v is not None and k_cache is not None and v_cache is not None and slot_mapping is not None:
        if v.shape != k.shape or v.stride(-1) != 1:
            raise ValueError(f"qk_norm_rope: v {tuple(v.shape)} does not fit k {tuple(k.shape)}")
        if (
            k_cache.shape != v_cache.shape
            or k_cache.shape[2:] != (num_kv_heads, head_dim)
            or k_cache.stride(-1) != 1
            or k_cache.stride() != v_cache.stride()
        ):
            raise ValueError(
                f"qk_norm_rope: k_cache {tuple(k_cache.shape)} / v_cache "
                f"{tuple(v_cache.shape)} do not fit k {tuple(k.shape)}"
            )
        if slot_mapping.shape != (n,):
            raise ValueError(f"qk_norm_rope: slot_mapping {tuple(slot_mapping.shape)} != ({n},)")
        cache_strides = k_cache.stride()[:3]
        block_size = k_cache.shape[1]
    else:
        v, k_cache, v_cache, slot_mapping = k, k, k, positions  # unused by STORE=False
        cache_strides, block_size = (0, 0, 0), 1
    if n == 0:
        return
    rows = rows_per_program
    _qk_norm_rope_kernel[(triton.cdiv(n, rows), num_q_heads + num_kv_heads)](
        q,
        k,
        v,
        q_weight,
        k_weight,
        cos_sin_cache,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        n,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *cache_strides,
        eps,
        k_scale,
        v_scale,
        NUM_Q_HEADS=num_q_heads,
        HALF=head_dim // 2,
        STORE=all(store),
        BLOCK_SIZE=block_size,
        ROWS=rows,
        num_warps=1 if rows == 1 else 4,
        # no fused multiply-adds: Triton may recompute y for the cache store in another layout,
        # and a contraction there would store a k that differs from the k written in place
        enable_fp_fusion=False,
        **pdl_launch(q),
    )
