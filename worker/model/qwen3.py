"""Qwen3 decoder-only transformer, tensor-parallel aware. ModelRunner calls forward(input_ids,
positions) with the batch layout in worker.layers.context, then compute_logits on the rows it samples from.
"""

from typing import ClassVar

import torch
from torch import nn

from nanoserve.worker.layers.activation import SiluAndMul
from nanoserve.worker.layers.attention import Attention
from nanoserve.worker.layers.context import get_context
from nanoserve.worker.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from nanoserve.worker.layers.layernorm import RMSNorm
from nanoserve.worker.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    gated_linear,
)
from nanoserve.worker.layers.rotary_embedding import RotaryEmbedding
from nanoserve.worker.model.config import ModelConfig


class Qwen3Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rms_norm_eps: float,
        rope_theta: float,
        max_position: int,
    ):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads)
        # heads on this rank
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        # partial sums: post_attention_layernorm all-reduces them (fused with its add + norm)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, reduce_results=False)
        # Qwen3 normalises each head's q and k over head_dim before the rotary embedding
        self.q_norm = RMSNorm(head_dim, eps=rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(head_dim, max_position, rope_theta)
        self.attn = Attention(self.num_heads, head_dim, head_dim**-0.5, self.num_kv_heads)

    def project(
        self, positions: torch.Tensor, qkv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """Everything between the qkv projection and the attention proper: (q, k, v, kv_stored);
        q (N, Hq, D) and k (N, Hkv, D) normed and rotated, v (N, Hkv * D); kv_stored: k/v are
        already in the cache."""
        # qkv: (N, (Hq + 2 * Hkv) * D), heads of this rank
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # (N, Hq, D), a strided view of qkv
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # (N, Hkv, D)
        kv_stored = False
        # norms + rotary in one kernel, in place (on CUDA; on CPU only a test sets the Triton
        # backend, whose kernels then run in Triton's interpreter)
        if qkv.is_cuda or self.attn.backend == "triton":
            from nanoserve.worker.kernels import qk_norm_rope

            cache_on = self.rotary_emb.cache_on(qkv.device)
            if self.attn.fuses_kv_store:  # the same kernel writes k/v into the paged cache
                qk_norm_rope(
                    q,
                    k,
                    self.q_norm.weight,
                    self.k_norm.weight,
                    cache_on,
                    positions,
                    self.q_norm.eps,
                    v=v.view(-1, self.num_kv_heads, self.head_dim),
                    k_cache=self.attn.k_cache,
                    v_cache=self.attn.v_cache,
                    slot_mapping=get_context().slot_mapping,
                    k_scale=self.attn.k_scale,
                    v_scale=self.attn.v_scale,
                )
                kv_stored = True
            else:
                qk_norm_rope(
                    q,
                    k,
                    self.q_norm.weight,
                    self.k_norm.weight,
                    cache_on,
                    positions,
                    self.q_norm.eps,
                )
        else:
            q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        return q, k, v, kv_stored

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (N, hidden) -> (N, hidden), this rank's partial sum
        return self.attend(positions, self.qkv_proj(hidden_states))

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """The layer from its qkv projection on (the decoder layer's fused norm made it)."""
        if self.attn.fuses_norm_rope and not get_context().is_prefill:
            o = self.decode_raw(positions, qkv)
        else:
            q, k, v, kv_stored = self.project(positions, qkv)
            o = self.attn(q.flatten(1), k.flatten(1), v, kv_stored=kv_stored)  # (N, Hq * D)
        return self.o_proj(o)  # (N, hidden), this rank's partial sum

    def decode_raw(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """A decode step's attention straight from the raw qkv: the attention kernel normalises
        and rotates q and k and stores k/v itself (no qk_norm_rope launch). -> (N, Hq * D)"""
        from nanoserve.worker.kernels.decode_attention import NewTokens

        n, d = qkv.shape[0], self.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        slot_mapping = get_context().slot_mapping
        assert slot_mapping is not None, "a decode step runs with its slot_mapping (set_context)"
        new = NewTokens(
            k.view(n, self.num_kv_heads, d),
            v.view(n, self.num_kv_heads, d),
            self.q_norm.weight,
            self.k_norm.weight,
            self.rotary_emb.cache_on(qkv.device),
            positions,
            slot_mapping,
            self.q_norm.eps,
        )
        return self.attn.decode_raw(q.view(n, self.num_heads, d), new)


class Qwen3MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.act_fn = SiluAndMul()
        # partial sums: the next layer's input_layernorm (or the final norm) all-reduces them
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, reduce_results=False)
        self.fuse_decode = False  # activate's gated kernel (EngineConfig.decode_fusions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (N, hidden) -> (N, 2 * I / tp) -> (N, I / tp) -> (N, hidden), a partial sum over ranks
        return self.down_proj(self.activate(x))

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up: (N, hidden) -> (N, I / tp); one kernel for a decode row on CUDA
        (fuse_decode: EngineConfig.decode_fusions)."""
        h = gated_linear(x, self.gate_up_proj.weight) if self.fuse_decode else None
        return self.act_fn(self.gate_up_proj(x)) if h is None else h


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Qwen3Attention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.rope_theta,
            config.max_position_embeddings,
        )
        self.mlp = Qwen3MLP(config.hidden_size, config.intermediate_size)
        # each norm after a sub-block all-reduces its partial sums; the two alternate slots
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, all_reduce_slot=1)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, all_reduce_slot=0
        )

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # the residual add of each sub-block is fused into the norm that follows it, and for a
        # decode row on one rank that norm into the GEMV after it (RMSNorm.fused_linear)
        attn, mlp = self.self_attn, self.mlp
        fused = self.input_layernorm.fused_linear(hidden_states, residual, attn.qkv_proj.weight)
        if fused is not None:
            qkv, residual = fused
        else:
            if residual is None:
                hidden_states, residual = self.input_layernorm(hidden_states), hidden_states
            else:
                hidden_states, residual = self.input_layernorm(hidden_states, residual)
            qkv = attn.qkv_proj(hidden_states)
        hidden_states = attn.attend(positions, qkv)
        fused = self.post_attention_layernorm.fused_linear(
            hidden_states, residual, mlp.gate_up_proj.weight, gated=True
        )
        if fused is not None:
            h, residual = fused
        else:
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            h = mlp.activate(hidden_states)
        return mlp.down_proj(h), residual


class Qwen3Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, all_reduce_slot=1)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None  # (N, hidden)
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class Qwen3ForCausalLM(nn.Module):
    # checkpoint name -> (parameter it is packed into, shard_id for that parameter's weight_loader)
    packed_modules_mapping: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, positions: (N,) for all scheduled tokens of the batch -> (N, hidden)
        return self.model(input_ids, positions)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        # (B, hidden), the rows the caller samples from -> (B, vocab), full on every rank; into
        # `out` when given
        return self.lm_head(hidden_states, out)
