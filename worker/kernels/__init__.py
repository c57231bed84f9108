"""Triton kernels for the worker's hot path: KV-cache store, paged prefill/decode attention, fused
norms.

Imported lazily by worker.layers (CUDA only; on CPU they run under TRITON_INTERPRET=1 for tests).
"""

from nanoserve.worker.kernels.decode_attention import paged_decode_attention
from nanoserve.worker.kernels.decode_rules import choose_num_splits
from nanoserve.worker.kernels.norm import fused_add_rms_norm, rms_norm, silu_and_mul
from nanoserve.worker.kernels.prefill_attention import paged_prefill_attention
from nanoserve.worker.kernels.qk_norm_rope import qk_norm_rope
from nanoserve.worker.kernels.store_kvcache import store_kvcache

__all__ = [
    "choose_num_splits",
    "fused_add_rms_norm",
    "paged_decode_attention",
    "paged_prefill_attention",
    "qk_norm_rope",
    "rms_norm",
    "silu_and_mul",
    "store_kvcache",
]
