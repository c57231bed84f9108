"""CUDA graphs for decode steps: one graph per batch-size bucket, captured after the KV cache exists.

ModelRunner.forward replays the smallest bucket that holds the batch; inputs are copied into
persistent buffers; padded rows have slot -1 and context length 0, so they never touch live blocks.
"""
import logging
from typing import TYPE_CHECKING

import torch

from worker.context import get_context, reset_context, set_context

if TYPE_CHECKING:
    from worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    top = min(max_num_seqs, 512)
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= top] + list(range(16, top + 1, 16))
    return sizes if sizes[-1] == top else sizes + [top]


class CudaGraphRunner:

    def __init__(self, runner: "ModelRunner"):
        self.model = runner.model
        max_bs = min(runner.config.max_num_seqs, 512)
        dev, width = runner.device, runner.max_num_blocks_per_seq
        hidden_size = runner.model_config.hidden_size
        # persistent inputs: every replay reads these addresses
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.block_tables = torch.full((max_bs, width), -1, dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.outputs = torch.zeros(max_bs, hidden_size, dtype=runner.dtype, device=dev)
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first so smaller graphs reuse its pool
            graph = torch.cuda.CUDAGraph()
            self._set_context(bs, max_seqlen_k=runner.max_model_len)
            self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])  # warm-up
            with torch.cuda.graph(graph, pool):
                self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()
            reset_context()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.batch_sizes)

    def _set_context(self, bs: int, max_seqlen_k: int) -> None:
        set_context(is_prefill=False, cu_seqlens_q=self.cu_seqlens_q[:bs + 1], max_seqlen_q=1,
                    max_seqlen_k=max_seqlen_k, slot_mapping=self.slot_mapping[:bs],
                    context_lens=self.context_lens[:bs], block_tables=self.block_tables[:bs])

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.batch_sizes[-1]

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        bs = next(b for b in self.batch_sizes if b >= n)
        ctx = get_context()
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:bs].fill_(-1)
        self.slot_mapping[:n] = ctx.slot_mapping
        self.context_lens[:bs].zero_()
        self.context_lens[:n] = ctx.context_lens
        width = ctx.block_tables.shape[1]
        self.block_tables[:n, :width] = ctx.block_tables
        self.graphs[bs].replay()
        return self.outputs[:n]
