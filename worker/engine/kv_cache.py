"""How many KV-cache blocks a ModelRunner allocates: on CUDA, the memory left after the weights
and the peak of the largest step (measured by running it once without a cache).
"""

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from nanoserve.worker.context import reset_context, set_context
from nanoserve.worker.sampler import SamplingTensors, sample

if TYPE_CHECKING:
    from nanoserve.worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def blocks_that_fit(self: "ModelRunner") -> int:
    """KV-cache blocks for this runner: cpu_kvcache_gib on CPU; on CUDA what is left of
    gpu_memory_utilization after the weights and the peak of the largest step."""
    if self.device.type == "cpu":
        return max(1, int(self.config.cpu_kvcache_gib * 2**30) // self.block_bytes)
    # measure the peak of the largest step without a cache, then fill what is left
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    largest_step(self)
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    # CUDA graphs take their private pool after the cache exists: keep room for it
    graph_reserve = 0 if self.config.enforce_eager else 2 * 2**30
    budget = (
        total * self.config.gpu_memory_utilization
        - (total - free)
        - (peak - current)
        - graph_reserve
    )
    logger.info(
        "GPU memory: total %.1f GiB, in use %.1f GiB, warm-up peak %.1f GiB over %.1f GiB "
        "resident -> %.1f GiB for the KV cache",
        total / 2**30,
        (total - free) / 2**30,
        peak / 2**30,
        current / 2**30,
        budget / 2**30,
    )
    return int(budget) // self.block_bytes


@torch.inference_mode()
def largest_step(self: "ModelRunner") -> None:
    """Forward and sample the largest step the config allows, without a cache (its peak memory)."""
    cfg = self.config
    num_tokens = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * self.max_model_len)
    num_seqs = min(cfg.max_num_seqs, num_tokens)
    lens = [num_tokens // num_seqs] * num_seqs
    lens[-1] += num_tokens - sum(lens)
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device=self.device)
    set_context(
        is_prefill=True,
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        max_seqlen_q=max(lens),
        max_seqlen_k=max(lens),
    )
    input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
    positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
    hidden = self.model(input_ids, positions)
    logits = self.model.compute_logits(hidden[cu[1:].long() - 1])
    t = SamplingTensors(
        temperatures=torch.ones(num_seqs, device=self.device),
        top_ks=None,
        top_ps=torch.full((num_seqs,), 0.9, device=self.device),
        min_ps=None,
    )
    sample(logits, t)
    reset_context()
    torch.cuda.synchronize()
