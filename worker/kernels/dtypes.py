"""Operand dtype for tl.dot in the attention kernels (decode_attention, prefill_attention), and the
KV-cache dtypes they read."""

import torch
import triton
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
# an fp8 cache (kv_cache_dtype=fp8) holds k / k_scale and v / v_scale; the kernels widen what they
# load to q's dtype and fold the scales into the softmax scale and the output
FP8_KV_DTYPE = torch.float8_e4m3fn


def dot_dtype(cache_dtype: torch.dtype, q_dtype: torch.dtype | None = None) -> tl.dtype:
    """The KV cache dtype (fp16 for an fp8 cache read with 16-bit q, else q's dtype); q and p are
    cast to it so tl.dot sees matching operands.

    Under TRITON_INTERPRET the CPU interpreter computes bf16 tl.dot on the raw bits (Triton 3.6), so bf16 is
    widened to fp32 there; loads, stores and conversions stay bf16. Compiled kernels always use the
    cache dtype.
    """
    if cache_dtype == FP8_KV_DTYPE and q_dtype is not None:
        # fp16: e4m3 -> fp16 is one native conversion on Hopper (cvt.f16x2.e4m3x2) and exact (every
        # e4m3 value is an fp16); e4m3 -> bf16 is not. Decode over mixed lengths at B=256 went from
        # 251.6 to 236.6 µs (H200, 2026-12-01), still ~0.55 of the fp8 bytes' bound. q (RMS-normed)
        # and p (in [0, 1]) fit fp16's range and keep more mantissa than in bf16.
        cache_dtype = torch.float16 if q_dtype in (torch.bfloat16, torch.float16) else q_dtype
        if triton.knobs.runtime.interpret:
            return tl.float32
    if cache_dtype not in _TL_DTYPES:
        raise ValueError(
            f"KV cache dtype {cache_dtype} is not supported (float32, float16, bfloat16)"
        )
    if cache_dtype == torch.bfloat16 and triton.knobs.runtime.interpret:
        return tl.float32
    return _TL_DTYPES[cache_dtype]
