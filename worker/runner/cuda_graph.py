"""CUDA graphs for decode steps: one graph per batch-size bucket, captured after the KV cache exists.

A graph covers the whole decode forward and the LM head. Its inputs live in one persistent int32
device buffer, laid out per bucket; ModelRunner.execute fills it from a pinned staging buffer (one
host->device copy on a side stream, then one kernel on the compute stream: worker.kernels.
graph_inputs) and replays the smallest bucket that holds the batch. Padded rows have slot -1
and context length 0, so they never touch live blocks.
"""

import logging
from functools import partial

import torch

from nanoserve.worker.kernels.graph_inputs import graph_inputs
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from nanoserve.worker.runner.graph_capture import CaptureTimes, capture_graph
from nanoserve.worker.runner.host_copy import PinnedRing, side_stream
from nanoserve.worker.runner.step_inputs import StepInputs

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    top = min(max_num_seqs, 512)
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= top] + list(range(16, top + 1, 16))
    return sizes if sizes[-1] == top else sizes + [top]


class CudaGraphRunner:
    def __init__(
        self,
        model: Qwen3ForCausalLM,
        max_num_seqs: int,
        max_model_len: int,
        max_num_blocks_per_seq: int,
        vocab_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.model = model
        max_bs = min(max_num_seqs, 512)
        dev, self.width = device, max_num_blocks_per_seq
        # per bucket bs: [input_ids | positions | slot_mapping | context_lens] (bs each), then the
        # (bs, width) block tables
        self.inputs = torch.zeros(max_bs * (4 + self.width), dtype=torch.int32, device=dev)
        self.staging = PinnedRing(len(self.inputs), torch.int32)
        # the host->device copies run on a side stream, into device staging buffers (one a pinned
        # buffer; `read` says when the compute stream has taken one in): the compute stream then
        # meets no copy engine between the sampler and the replay
        self.device_staging = [torch.empty_like(self.inputs) for _ in range(2)]
        self.read = [torch.cuda.Event() for _ in range(2)]
        self.copy_stream = side_stream(dev, "to_device")
        self.cu_seqlens_q = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(max_bs, vocab_size, dtype=dtype, device=dev)
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_times = CaptureTimes()
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first so smaller graphs reuse its pool
            ids, pos, slots, lens, tables = self._views(self.inputs, bs)
            slots.fill_(-1)
            set_context(
                is_prefill=False,
                cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
                max_seqlen_q=1,
                max_seqlen_k=max_model_len,
                slot_mapping=slots,
                context_lens=lens,
                block_tables=tables,
            )
            graph = capture_graph(partial(self._forward, bs, ids, pos), pool, self.capture_times)
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            reset_context()
        logger.info(
            "captured CUDA graphs for decode batch sizes %s: %s",
            self.batch_sizes,
            self.capture_times.summary(),
        )

    def _views(self, flat, bs: int) -> list:
        """(ids, positions, slots, context_lens, block_tables (bs, width)) views of a flat buffer."""
        parts = [flat[i * bs : (i + 1) * bs] for i in range(4)]
        return parts + [flat[4 * bs : 4 * bs + bs * self.width].reshape(bs, self.width)]

    def _forward(self, bs: int, ids: torch.Tensor, pos: torch.Tensor) -> None:
        hidden = self.model(ids, pos)
        self.model.compute_logits(hidden, out=self.logits[:bs])

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.batch_sizes[-1]

    def run(self, x: StepInputs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the decode step x (its token ids from the device tensor input_ids when given);
        returns its (B, vocab) logits (a view valid until the next replay)."""
        n = len(x.input_ids)
        bs = next(b for b in self.batch_sizes if b >= n)
        w = x.block_tables.shape[1]
        if w > self.width:
            raise ValueError(f"block_tables width {w} exceeds the graphs' {self.width}")
        i, staging, done = self.staging.take()
        device_staging, read = self.device_staging[i], self.read[i]
        used = 4 * bs + n * self.width  # rows past n of the block tables are never read
        ids, pos, slots, lens, tables = self._views(staging.numpy(), bs)
        ids[:n], pos[:n], slots[:n], lens[:n] = (
            x.input_ids,
            x.positions,
            x.slot_mapping,
            x.context_lens,
        )
        ids[n:], pos[n:], slots[n:], lens[n:] = 0, 0, -1, 0
        tables[:n, :w] = x.block_tables
        compute = torch.cuda.current_stream()
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(read)  # its last reader, two steps ago, is done
            device_staging[:used].copy_(staging[:used], non_blocking=True)
            done.record(self.copy_stream)
        compute.wait_event(done)
        # the previous step's sampled ids (never seen by the host) over the first n entries
        graph_inputs(device_staging, self.inputs, used, input_ids)
        read.record(compute)
        self.graphs[bs].replay()
        return self.logits[:n]
