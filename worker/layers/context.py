"""Per-step batch metadata shared by the model runner and the attention layers.

ModelRunner.load_inputs fills it before each forward; Attention and the LM-head selection read it, so the
model's forward keeps the plain `(input_ids, positions)` signature (the nano-vllm design).
"""

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Context:
    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None  # (batch + 1,) int32, prefix sums of new-token counts
    cu_seqlens_k: torch.Tensor | None = (
        None  # (batch + 1,) int32 kv prefix sums (flash-attn prefill)
    )
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    slot_mapping: torch.Tensor | None = (
        None  # (num_tokens,) int32 cache slot per new token, -1 = skip
    )
    context_lens: torch.Tensor | None = None  # (batch,) int32 total kv length per sequence
    block_tables: torch.Tensor | None = None  # (batch, max_blocks) int32, padded with -1
    # a prefill step of one prompt, nothing cached: attend with torch's SDPA over all its (padded)
    # rows, causal (EngineConfig.prefill_sdpa_min_tokens; set by ModelRunner.execute)
    sdpa_prefill: bool = False


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(**kwargs) -> None:
    global _CONTEXT
    _CONTEXT = Context(**kwargs)


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
