"""A CUDA runner's start-up, after its KV cache exists: the decode and prefill CUDA graphs captured
(with the device memory they take) and every kernel a step can reach compiled, or loaded from the
Triton cache, so that no request waits for a compile. ModelRunner.__init__ calls it once.
"""

import logging
import os
import time
from typing import TYPE_CHECKING

import torch

from nanoserve.worker.runner.cuda_graph import CudaGraphRunner
from nanoserve.worker.runner.device import device_memory_used
from nanoserve.worker.runner.prefill_graph import (
    PrefillGraphRunner,
    attention_warmup_steps,
    pad_to_bucket,
)

if TYPE_CHECKING:
    from nanoserve.worker.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@torch.no_grad()  # no autograd graph may hold on to the captured tensors
def capture_and_compile(runner: "ModelRunner", backend: str) -> None:
    """Sets runner.graphs, runner.prefill_graphs and runner.graph_memory_bytes (unless
    enforce_eager), then compiles each tile size of the prefill attention."""
    started = time.perf_counter()
    if not runner.config.enforce_eager:
        used_before = device_memory_used(runner.device)
        runner.graphs = CudaGraphRunner(
            runner.model,
            runner.config.max_num_seqs,
            runner.max_model_len,
            runner.max_num_blocks_per_seq,
            runner.model_config.vocab_size,
            runner.dtype,
            runner.device,
        )
        if runner.prefill_buckets:
            runner.prefill_graphs = PrefillGraphRunner(
                runner.model,
                runner.prefill_buckets,
                runner.config.max_num_seqs,
                runner.max_num_blocks_per_seq,
                runner.device,
            )
        # the graphs' private pools and fixed buffers (their share of the device's memory)
        runner.graph_memory_bytes = device_memory_used(runner.device) - used_before
    if backend == "triton":  # each tile size of the prefill attention (its one length-bound
        attn = runner.attention_layers[0]  # constexpr), from a one-sequence step of slots -1
        for x in attention_warmup_steps(
            attn.num_heads // attn.num_kv_heads, runner.dtype == torch.float32, runner.block_size
        ):
            runner.execute(pad_to_bucket(x, runner.prefill_buckets))
        torch.cuda.synchronize(runner.device)
    logger.info(
        "kernels compiled (or loaded from %s) and graphs captured (%.0f MiB) in %.1f s",
        os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache"),
        runner.graph_memory_bytes / 2**20,
        time.perf_counter() - started,
    )
