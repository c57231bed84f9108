"""Attention over the paged KV cache: store the new k/v by slot_mapping, then attend.

On the Triton and flash-attn backends Qwen3Attention's q/k-norm + rotary kernel stores k/v already
(fuses_kv_store), and forward is told so (kv_stored) and skips its own store. In a decode step on the
Triton backend the attention kernel does that kernel's work itself (decode_raw).

Backends: torch (gather the blocks, SDPA; the CPU path and the reference), Triton kernels on CUDA
(worker.kernels), flash-attn when asked for (attention_backend=flash_attn). All read the batch layout from nanoserve.worker.layers.context.
KV cache layout: (num_blocks, block_size, num_kv_heads, head_dim), the flash-attn paged layout.
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.worker.layers.context import get_context

if TYPE_CHECKING:  # the kernels import Triton: only on the CUDA path
    from nanoserve.worker.kernels.decode_attention import NewTokens

FP8_KV_DTYPE = torch.float8_e4m3fn  # kv_cache_dtype=fp8 (worker.kernels.dtypes names the same)


def store_kvcache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    # key, value: (num_tokens, num_kv_heads, head_dim); slot -1 marks a padded token. The cache
    # holds key / k_scale and value / v_scale (an fp8 cache; 1.0 otherwise)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k, v = key[valid], value[valid]
    if k_cache.dtype == FP8_KV_DTYPE:
        k, v = (k.float() / k_scale).to(k_cache.dtype), (v.float() / v_scale).to(v_cache.dtype)
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v


def _gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    # (num_blocks, block_size, H, D) -> (length, H, D) for one sequence, in dtype
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    kv = cache[block_table[:num_blocks].long()].flatten(0, 1)[:length]
    return (kv.float() * scale).to(dtype) if cache.dtype == FP8_KV_DTYPE else kv


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # q: (Lq, Hq, D); k, v: (Lk, Hkv, D). Query i sits at position Lk - Lq + i (bottom-right causal).
    lq, lk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    qpos = torch.arange(lk - lq, lk, device=q.device)[:, None]
    mask = torch.arange(lk, device=q.device)[None, :] <= qpos  # (Lq, Lk)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Reference paged attention for prefill, extend and decode. q: (num_tokens, Hq, D)."""
    out = torch.empty_like(q)
    starts, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for i, length in enumerate(lens):
        s, e = starts[i], starts[i + 1]
        if e == s:
            continue
        k = _gather_kv(k_cache, block_tables[i], length, k_scale, q.dtype)
        v = _gather_kv(v_cache, block_tables[i], length, v_scale, q.dtype)
        out[s:e] = _attend(q[s:e], k, v, scale)
    return out


def varlen_attention_torch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention over the new tokens only (no cache yet: the KV-cache sizing's warm-up
    forward of the largest step, hundreds of sequences). The sequences of one length go through
    SDPA together: one call a length a layer, not one a sequence (256 sequences x 28 layers took
    seconds of the start-up)."""
    out = torch.empty_like(q)
    starts = cu_seqlens.tolist()
    by_len: dict[int, list[int]] = {}
    for s, e in zip(starts[:-1], starts[1:]):
        if e > s:
            by_len.setdefault(e - s, []).append(s)
    group = q.shape[1] // k.shape[1]
    for n, firsts in by_len.items():
        rows = torch.tensor(firsts, device=q.device)[:, None] + torch.arange(n, device=q.device)
        # (B, n, H, D) -> (B, H, n, D); the kv heads repeated over their q heads. Not _attend:
        # square and causal, SDPA takes is_causal (its fused kernels, no (n, n) mask), which
        # the KV sizing's warm-up peak was measured with
        qb, kb, vb = (x[rows].transpose(1, 2) for x in (q, k, v))
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        out[rows] = o.transpose(1, 2)
    return out


def _given(t: torch.Tensor | None) -> torch.Tensor:
    """A context field this forward reads (ModelRunner sets every field a backend reads)."""
    assert t is not None, "attention ran without the step's context (set_context)"
    return t


_CUDNN_TAKES: dict[tuple, bool] = {}


def cudnn_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether torch's cuDNN SDPA runs on these (1, H, N, D) views as they are, causal, with GQA:
    some torch versions accept only q, k, v each dense in (N, H, D) (cuDNN's "unpacked" layout),
    not the qkv projection's column slices. By shape and strides, asked once each."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device)
    if key not in _CUDNN_TAKES:
        try:
            from torch.backends.cuda import SDPAParams, can_use_cudnn_attention

            params = SDPAParams(q, k, v, None, 0.0, True, True)
            _CUDNN_TAKES[key] = bool(can_use_cudnn_attention(params, False))
        except (ImportError, TypeError, RuntimeError):  # another torch's signature: copy
            _CUDNN_TAKES[key] = False
    return _CUDNN_TAKES[key]


class Attention(nn.Module):
    """One layer's attention; the runner assigns k_cache/v_cache views after sizing the cache."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.scale = num_heads, head_dim, scale
        self.num_kv_heads = num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])
        # the cache holds k / k_scale and v / v_scale: per-tensor scales of an fp8 cache (1.0, the
        # uncalibrated default; exact for a bf16 / fp32 cache)
        self.k_scale = self.v_scale = 1.0
        self.backend = "torch"  # "torch" | "triton" | "flash_attn"; set by ModelRunner
        self.fuse_decode = False  # decode_raw (EngineConfig.decode_fusions; set by ModelRunner)

    @property
    def fuses_kv_store(self) -> bool:
        """Whether the caller stores k/v into the cache itself (in its q/k-norm + rotary kernel) and
        passes kv_stored=True: the CUDA backends once the cache exists."""
        return self.k_cache.numel() > 0 and self.backend in ("triton", "flash_attn")

    @property
    def fuses_norm_rope(self) -> bool:
        """Whether a decode step's raw q, k, v go to decode_raw, whose kernel normalises, rotates
        and stores them (one kernel boundary a layer fewer): the Triton backend with its cache,
        where asked for (fuse_decode)."""
        return self.fuse_decode and self.k_cache.numel() > 0 and self.backend == "triton"

    def decode_raw(self, q: torch.Tensor, new: "NewTokens") -> torch.Tensor:
        """A decode step from the qkv projection's raw q (N, Hq, D) and new (raw k and v, the
        norms' weights, the rotary table, positions, slots, eps) -> (N, Hq * D)."""
        from nanoserve.worker.kernels import paged_decode_attention

        ctx = get_context()
        return paged_decode_attention(
            q,
            self.k_cache,
            self.v_cache,
            _given(ctx.block_tables),
            _given(ctx.context_lens),
            self.scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            new=new,
        ).flatten(1, 2)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_stored: bool = False
    ) -> torch.Tensor:
        # q: (N, Hq * D) -> (N, Hq, D); k, v: (N, Hkv * D) -> (N, Hkv, D)
        # kv_stored: this step's k/v are already in k_cache/v_cache at ctx.slot_mapping
        ctx = get_context()
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel() == 0:
            o = varlen_attention_torch(q, k, v, _given(ctx.cu_seqlens_q), self.scale)
        elif self.backend == "triton":
            o = self._triton(q, k, v, ctx, kv_stored)
        elif self.backend == "flash_attn":
            o = self._flash_attn(q, k, v, ctx, kv_stored)
        else:
            if not kv_stored:
                store_kvcache_torch(
                    k,
                    v,
                    self.k_cache,
                    self.v_cache,
                    _given(ctx.slot_mapping),
                    self.k_scale,
                    self.v_scale,
                )
            o = paged_attention_torch(
                q,
                self.k_cache,
                self.v_cache,
                _given(ctx.block_tables),
                _given(ctx.cu_seqlens_q),
                _given(ctx.context_lens),
                self.scale,
                self.k_scale,
                self.v_scale,
            )
        return o.flatten(1, 2)

    def _prefill(self, q: torch.Tensor, ctx) -> torch.Tensor:
        from nanoserve.worker.kernels import paged_prefill_attention

        return paged_prefill_attention(
            q,
            self.k_cache,
            self.v_cache,
            _given(ctx.block_tables),
            _given(ctx.cu_seqlens_q),
            _given(ctx.context_lens),
            self.scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )

    def sdpa_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """A step of one prompt with nothing cached: torch's SDPA over all its rows, causal, cuDNN
        first where it runs. q (N, Hq, D); k, v (N, Hkv, D), as the q/k-norm + rotary kernel left
        them (a bf16/fp16 cache holds the same values) -> (N, Hq, D). A bucket's padded rows come
        after the prompt's: causal, no prompt row attends to them."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
        qt, kt, vt = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))  # (1, H, N, D) views
        if not cudnn_takes(qt, kt, vt):  # q, k, v are column slices of the qkv projection
            qt, kt, vt = (x.contiguous().unsqueeze(0).transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(backends, set_priority=True):
            o = F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=True, scale=self.scale, enable_gqa=True
            )
        return o.transpose(1, 2).squeeze(0)

    def _triton(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx, kv_stored: bool
    ) -> torch.Tensor:
        from nanoserve.worker.kernels import paged_decode_attention, store_kvcache

        if not kv_stored:
            store_kvcache(
                k, v, self.k_cache, self.v_cache, ctx.slot_mapping, self.k_scale, self.v_scale
            )
        if ctx.is_prefill:
            return self.sdpa_prefill(q, k, v) if ctx.sdpa_prefill else self._prefill(q, ctx)
        return paged_decode_attention(
            q,
            self.k_cache,
            self.v_cache,
            ctx.block_tables,
            ctx.context_lens,
            self.scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )

    def _flash_attn(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx, kv_stored: bool
    ) -> torch.Tensor:
        # flash-attn's paged kernels read the same (num_blocks, block_size, Hkv, D) layout; they
        # need block_size % 256 == 0 (checked by ModelRunner)
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        from nanoserve.worker.kernels import store_kvcache

        if not kv_stored:
            store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_prefill:
            return flash_attn_varlen_func(
                q,
                self.k_cache,
                self.v_cache,
                cu_seqlens_q=ctx.cu_seqlens_q,
                cu_seqlens_k=ctx.cu_seqlens_k,
                max_seqlen_q=ctx.max_seqlen_q,
                max_seqlen_k=ctx.max_seqlen_k,
                softmax_scale=self.scale,
                causal=True,
                block_table=ctx.block_tables,
            )
        return flash_attn_with_kvcache(
            q.unsqueeze(1),
            self.k_cache,
            self.v_cache,
            cache_seqlens=ctx.context_lens,
            block_table=ctx.block_tables,
            softmax_scale=self.scale,
            causal=True,
        ).squeeze(1)
