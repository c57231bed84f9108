"""The KV cache a ModelRunner allocates (make_kv_cache): how many blocks, on CUDA the memory left
after the weights and the peak of the largest step (measured by running it once without a cache,
with one chunk of prompt-logprob rows), and the paged tensor the attention layers view.
"""

import logging
import math

import numpy as np
import torch

from nanoserve.sampling import MAX_LOGPROBS
from nanoserve.worker.config import EngineConfig
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from nanoserve.worker.runner.logprobs import PROMPT_CHUNK_ROWS, pack, prompt_chunk_bytes
from nanoserve.worker.runner.sampler import SamplingTensors, sample

logger = logging.getLogger(__name__)


def blocks_that_fit(
    config: EngineConfig,
    device: torch.device,
    block_bytes: int,
    model: Qwen3ForCausalLM,
    max_model_len: int,
) -> int:
    """KV-cache blocks for this runner: cpu_kvcache_gib on CPU; on CUDA what is left of
    gpu_memory_utilization after the weights and the peak of the largest step."""
    if device.type == "cpu":
        return max(1, int(config.cpu_kvcache_gib * 2**30) // block_bytes)
    # measure the peak of the largest step without a cache, then fill what is left
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    largest_step(config, device, model, max_model_len)
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    # CUDA graphs take their private pool after the cache exists: keep room for it
    graph_reserve = 0 if config.enforce_eager else 2 * 2**30
    budget = (
        total * config.gpu_memory_utilization - (total - free) - (peak - current) - graph_reserve
    )
    vocab, dtype = model.config.vocab_size, model.lm_head.weight.dtype
    logger.info(
        "GPU memory: total %.1f GiB, in use %.1f GiB, warm-up peak %.1f GiB over %.1f GiB "
        "resident (a prompt-logprob chunk of %d rows: %.2f GiB) -> %.1f GiB for the KV cache",
        total / 2**30,
        (total - free) / 2**30,
        peak / 2**30,
        current / 2**30,
        PROMPT_CHUNK_ROWS,
        prompt_chunk_bytes(PROMPT_CHUNK_ROWS, vocab, dtype) / 2**30,
        budget / 2**30,
    )
    return int(budget) // block_bytes


@torch.inference_mode()
def largest_step(
    config: EngineConfig, device: torch.device, model: Qwen3ForCausalLM, max_model_len: int
) -> None:
    """Forward and sample the largest step the config allows, without a cache (its peak memory),
    and reduce one chunk of prompt-logprob rows the way ModelRunner.execute does: its peak
    (prompt_chunk_bytes, ~0.5 GB for Qwen3 in bf16) over the step's hidden states is the most a
    prompt_logprobs request adds to a step, whatever its prompt length."""
    cfg = config
    num_tokens = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * max_model_len)
    num_seqs = min(cfg.max_num_seqs, num_tokens)
    lens = [num_tokens // num_seqs] * num_seqs
    lens[-1] += num_tokens - sum(lens)
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device=device)
    set_context(
        is_prefill=True,
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        max_seqlen_q=max(lens),
        max_seqlen_k=max(lens),
    )
    input_ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    hidden = model(input_ids, positions)
    rows = min(PROMPT_CHUNK_ROWS, num_tokens)
    chunk = model.compute_logits(hidden[:rows]).float().log_softmax(dim=-1)
    pack(chunk, input_ids[:rows], MAX_LOGPROBS)
    del chunk
    logits = model.compute_logits(hidden[cu[1:].long() - 1])
    t = SamplingTensors(
        temperatures=torch.ones(num_seqs, device=device),
        top_ks=None,
        top_ps=torch.full((num_seqs,), 0.9, device=device),
        min_ps=None,
    )
    sample(logits, t)
    reset_context()
    torch.cuda.synchronize()


def num_kvcache_blocks(
    config: EngineConfig,
    device: torch.device,
    block_bytes: int,
    model: Qwen3ForCausalLM,
    max_model_len: int,
    world_size: int,
) -> int:
    """The configured block count, or what fits (the least over the ranks: every rank must hold
    the same blocks); ValueError when not one block fits."""
    num_blocks = config.num_kvcache_blocks
    if num_blocks is None:
        num_blocks = blocks_that_fit(config, device, block_bytes, model, max_model_len)
        if world_size > 1:
            t = torch.tensor([num_blocks], device=device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
            num_blocks = int(t.item())
    if num_blocks < 1:
        raise ValueError(
            "not enough memory for a single KV-cache block; lower max_num_seqs / "
            "max_num_batched_tokens or raise gpu_memory_utilization"
        )
    return num_blocks


def make_kv_cache(
    config: EngineConfig,
    model: Qwen3ForCausalLM,
    attention_layers: list,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    world_size: int,
) -> torch.Tensor:
    """The paged cache of num_kvcache_blocks blocks, (2, layers, blocks, block_size, num_kv_heads,
    head_dim), each attention layer's k_cache / v_cache set to its slices."""
    head_shape = (attention_layers[0].num_kv_heads, attention_layers[0].head_dim)
    block_size = config.kvcache_block_size
    # K and V of block_size tokens in every layer
    block_bytes = 2 * len(attention_layers) * block_size * math.prod(head_shape) * dtype.itemsize
    num_blocks = num_kvcache_blocks(config, device, block_bytes, model, max_model_len, world_size)
    return allocate_kv_cache(attention_layers, num_blocks, block_size, head_shape, dtype, device)


def allocate_kv_cache(
    attention_layers: list,
    num_blocks: int,
    block_size: int,
    head_shape: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The paged cache, (2, layers, num_blocks, block_size, num_kv_heads, head_dim) zeros, with
    each attention layer's k_cache / v_cache set to its slices."""
    shape = (2, len(attention_layers), num_blocks, block_size, *head_shape)
    kv_cache = torch.zeros(shape, dtype=dtype, device=device)
    for i, layer in enumerate(attention_layers):
        layer.k_cache, layer.v_cache = kv_cache[0, i], kv_cache[1, i]
    logger.info(
        "KV cache: %d blocks of %d tokens (%.2f GiB)",
        num_blocks,
        block_size,
        kv_cache.numel() * kv_cache.element_size() / 2**30,
    )
    return kv_cache
