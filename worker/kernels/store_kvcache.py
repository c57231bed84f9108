"""Write this step's new k/v into the paged KV cache by slot_mapping (Attention.forward, first).

One program per token; slot -1 marks a padded token (CUDA-graph padding, a prefix-cache hit) and is
skipped, so padded entries never touch a live block.
"""

import torch
import triton
import triton.language as tl


# slot_mapping may be a view at a per-step offset; one scalar load a program: no alignment
# specialisation (a new alignment would compile a new kernel while serving)
@triton.jit(do_not_specialize_on_alignment=["slot_mapping_ptr"])
def _store_kvcache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    num_kv_heads,
    k_scale,
    v_scale,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < num_kv_heads)[:, None]
    # (BLOCK_H, HEAD_DIM) tile of this token's k and v; the last dim is contiguous everywhere
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(
        value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask
    )
    dst = block * stride_cb + offset * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    # the cache holds k / k_scale, v / v_scale (fp8; scales of 1.0 change no bit)
    k = (k.to(tl.float32) / k_scale).to(k_cache_ptr.dtype.element_ty)
    v = (v.to(tl.float32) / v_scale).to(v_cache_ptr.dtype.element_ty)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """key, value: (num_tokens, num_kv_heads, head_dim); caches: (num_blocks, block_size, num_kv_heads, head_dim),
    holding key / k_scale and value / v_scale (an fp8 cache; 1.0 otherwise)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != (num_kv_heads, head_dim):
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit key {tuple(key.shape)}")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping shape {tuple(slot_mapping.shape)} != ({num_tokens},)")
    if num_tokens == 0:
        return
    if (
        key.stride(-1) != 1
        or value.stride(-1) != 1
        or k_cache.stride(-1) != 1
        or k_cache.stride() != v_cache.stride()
    ):
        raise ValueError("store_kvcache needs contiguous head_dim and identical k/v cache strides")
    _store_kvcache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_kv_heads,
        k_scale,
        v_scale,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
