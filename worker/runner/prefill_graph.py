"""CUDA graphs for prefill steps: per token-count bucket, one graph of the whole forward, attention
included (the prefill attention finds its blocks from cu_seqlens_q on the device, so its grid
follows the bucket alone).

ModelRunner.prepare_prefill pads a step's tokens to a bucket (padded tokens have slot -1: they never
touch the KV cache; their rows are computed and never read). A step's inputs and attention metadata
go into one int32 buffer laid out per bucket (cu_seqlens_q padded with its last entry for the
bucket's most sequences: rows past the step's sequences own no query block), as the decode
graphs' do (runner.cuda_graph): written into a pinned buffer on the host, one copy to the device
on a side stream, one kernel into the graphs' buffer, one replay. Buckets from
EngineConfig.prefill_sdpa_min_tokens on have a second graph, for a step of one prompt with
nothing cached, whose attention is torch's SDPA (cuDNN) over the bucket's rows (takes_sdpa).
"""

import logging
import math
import time
from collections.abc import Callable
from typing import cast

import numpy as np
import torch

from nanoserve.worker.kernels.graph_inputs import graph_inputs
from nanoserve.worker.kernels.prefill_attention import prefill_block_q_lengths
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
from nanoserve.worker.runner.graph_capture import CaptureTimes, capture_graph
from nanoserve.worker.runner.host_copy import PinnedRing, side_stream
from nanoserve.worker.runner.step_inputs import StepInputs

logger = logging.getLogger(__name__)

MIN_BUCKET = 16


def prefill_buckets(max_tokens: int) -> list[int]:
    """Token counts a prefill step is padded to, up to max_tokens (included): powers of two to 256,
    then steps of 128 to 512, 256 to 2048, 512 to 4096, 1024 to 8192, 2048 beyond. Padding stays
    under a third of a step past 256 tokens, and 16-multiples keep the GEMM tiles whole."""
    if max_tokens < 1:
        return []
    sizes, n = [], MIN_BUCKET
    while n < max_tokens:
        sizes.append(n)
        n += (
            n
            if n < 256
            else 128
            if n < 512
            else 256
            if n < 2048
            else 512
            if n < 4096
            else (1024 if n < 8192 else 2048)
        )
    return sizes + [max_tokens]


def bucket_for(num_tokens: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding num_tokens, None when it is past the largest."""
    return next((b for b in buckets if b >= num_tokens), None)


def pad_to_bucket(x: StepInputs, buckets: list[int]) -> StepInputs:
    """x (a prefill step) with its tokens padded to the smallest bucket holding them: token 0 at
    position 0 in slot -1, outside every sequence of cu_seqlens_q, so never stored or attended."""
    n = len(x.input_ids)
    padded = bucket_for(n, buckets)
    if padded is None or padded == n:
        return x
    pad = padded - n
    x.input_ids = np.concatenate([x.input_ids, np.zeros(pad, np.int64)])
    x.positions = np.concatenate([x.positions, np.zeros(pad, np.int64)])
    x.slot_mapping = np.concatenate([x.slot_mapping, np.full(pad, -1, np.int64)])
    return x


def one_prompt_step(n: int, block_size: int, max_blocks: int | None = None) -> StepInputs:
    """A prefill step of one n-token prompt, nothing cached, its slots -1 (nothing stored) and its
    keys read from block 0 (its block table at most max_blocks wide): a start-up warm-up step."""
    blocks = min(math.ceil(n / block_size), max_blocks or n)
    return StepInputs(
        True,
        np.zeros(n, np.int64),
        np.arange(n),
        np.full(n, -1),
        np.array([0, n]),
        np.array([n]),
        np.zeros((1, blocks), np.int64),
        np.array([n - 1]),
        n,
        n,
    )


def attention_warmup_steps(group: int, fp32: bool, block_size: int) -> list[StepInputs]:
    """One single-sequence prefill step for each tile size of the prefill attention (the one kernel
    parameter that follows a step's token count). ModelRunner runs them at start so that no prompt
    compiles a kernel while serving (an eager step: past the largest bucket, or without graphs)."""
    return [one_prompt_step(n, block_size) for n in prefill_block_q_lengths(group, fp32)]


def takes_sdpa(x: StepInputs, lengths: tuple[int, int]) -> bool:
    """Whether step x attends with torch's SDPA (Attention.sdpa_prefill): a prefill of one prompt,
    nothing of it cached, its length within `lengths` (low, high; (0, 0): never; runner.warmup's
    sdpa_prefill_range). Such a step replays its bucket's SDPA graph (PrefillGraphRunner), or runs
    eagerly without graphs."""
    low, high = lengths
    return (
        low > 0
        and x.is_prefill
        and len(x.context_lens) == 1
        and x.max_seqlen_q == int(x.context_lens[0])
        and low <= x.max_seqlen_q <= high
    )


class PrefillGraphRunner:
    def __init__(
        self,
        model: Qwen3ForCausalLM,
        buckets: list[int],
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        capture: bool = True,
        sdpa_lengths: tuple[int, int] = (0, 0),
    ):
        """sdpa_lengths: the buckets that also get an SDPA graph, (low, high) ((0, 0): none;
        ModelRunner.sdpa_lengths)."""
        attn = cast(Qwen3DecoderLayer, model.model.layers[0]).self_attn.attn
        if not attn.fuses_kv_store:
            raise ValueError("prefill graphs need the Triton backend with the KV cache allocated")
        self.model, self.buckets, self.max_num_seqs = model, buckets, max_num_seqs
        self.width, self.capture = max_blocks_per_seq, capture
        self.layouts: dict[int, list[int]] = {}  # bucket -> its inputs' offsets (_layout)
        # the graphs' inputs, laid out per bucket (_views; the largest bucket's layout is the
        # longest); the layouts overlap, so _idle sets one bucket's just before its idle step
        self.inputs = torch.zeros(self._layout(buckets[-1])[-1], dtype=torch.int32, device=device)
        if capture:  # as CudaGraphRunner: pinned -> side stream -> device staging -> one kernel
            self.staging = PinnedRing(len(self.inputs), torch.int32)
            self.device_staging = [torch.empty_like(self.inputs) for _ in range(2)]
            self.read = [torch.cuda.Event() for _ in range(2)]
            self.copy_stream = side_stream(device, "to_device")
        else:
            self.host_inputs = torch.zeros_like(self.inputs)
        # (bucket, sdpa) -> (T, hidden) output of its graph
        self.hidden: dict[tuple[int, bool], torch.Tensor] = {}
        # (bucket, sdpa) -> one replay, or (capture=False: tests on CPU) the same forward eagerly
        self.steps: dict[tuple[int, bool], Callable[[], None]] = {}
        self.capture_times = CaptureTimes()  # stays empty without a capture
        # every bucket's graph, then an SDPA graph of each bucket in sdpa_lengths
        low, high = sdpa_lengths
        keys = [(n, False) for n in buckets]
        keys += [(n, True) for n in buckets if low and low <= n <= high]
        if not capture:
            self.steps = {key: self._forward(*key) for key in keys}
            return
        pool = None
        for key in sorted(keys, reverse=True):  # largest first: the smaller ones reuse its pool
            pool = self._capture(key, pool)
        # a graph's first replay uploads it to the GPU: here, not in a request's first token (the
        # slots are still -1 and cu_seqlens_q zeros: nothing is stored or attended)
        t = time.perf_counter()
        for key in self.steps:
            self.run_idle(key)
        torch.cuda.synchronize()
        logger.info(
            "captured prefill CUDA graphs for token counts %s (SDPA %s): %s, first replays %.2f s",
            buckets,
            f"{low}-{high}" if low else "none",
            self.capture_times.summary(),
            time.perf_counter() - t,
        )

    def _layout(self, n: int) -> list[int]:
        """Offsets in bucket n's inputs of [ids | positions | slots | logit rows (n each) |
        cu_seqlens_q (batch + 1) | context_lens (batch) | block_tables (batch, width)] and its
        end; batch = min(n, max_num_seqs) (a sequence has at least one token)."""
        if n not in self.layouts:
            batch = min(n, self.max_num_seqs)
            sizes = [n, n, n, n, batch + 1, batch, batch * self.width]
            self.layouts[n] = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return self.layouts[n]

    def _views(self, flat, n: int) -> list:
        """(ids, positions, slots, rows, cu_seqlens_q, context_lens, block_tables) of bucket n."""
        o = self._layout(n)
        parts = [flat[a:b] for a, b in zip(o, o[1:])]
        return parts[:-1] + [parts[-1].reshape(-1, self.width)]

    def _forward(self, n: int, sdpa: bool) -> Callable[[], None]:
        """The forward of n tokens over bucket n's inputs, its output kept in self.hidden; sdpa:
        a step of one prompt attended by torch's SDPA (its metadata unread: no batch rows)."""
        ids, pos, slots, _, cu, lens, tables = self._views(self.inputs, n)

        def forward() -> None:
            set_context(
                is_prefill=True,
                slot_mapping=slots,
                cu_seqlens_q=cu,
                context_lens=lens,
                block_tables=tables,
                sdpa_prefill=sdpa,
            )
            self.hidden[n, sdpa] = self.model(ids, pos)
            reset_context()

        return forward

    def _idle(self, n: int) -> None:
        """Bucket n's inputs for a step that stores and attends nothing (a capture's warm-up, a
        first replay): token ids and positions 0 (in range), slots -1, no query rows. Another
        bucket's slots (-1) lie over this one's ids, which an embedding lookup would read."""
        self.inputs[: self._layout(n)[-1]].zero_()
        self._views(self.inputs, n)[2].fill_(-1)

    def run_idle(self, key: tuple[int, bool]) -> None:
        """One step of graph `key` (bucket, sdpa) that stores and attends nothing: a graph's first
        replay at start-up."""
        self._idle(key[0])
        self.steps[key]()

    def _capture(self, key: tuple[int, bool], pool):
        self._idle(key[0])
        graph = capture_graph(self._forward(*key), pool, self.capture_times)
        self.steps[key] = graph.replay  # (a bound replay keeps its graph)
        return pool or graph.pool()

    def can_run(self, num_tokens: int, sdpa: bool = False) -> bool:
        return (num_tokens, sdpa) in self.steps

    def can_take(self, x: StepInputs, sdpa: bool) -> bool:
        """Whether prefill step x (padded to a bucket) replays a graph: every logit row a token's."""
        return self.can_run(len(x.input_ids), sdpa) and len(x.logit_rows) <= len(x.input_ids)

    def run(
        self, x: StepInputs, sdpa: bool, input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward prefill step x (can_take), its token ids from the device tensor input_ids (N,)
        when given (lookahead); (its (N, hidden) hidden states, its (R,) logit rows on the
        device), views valid until the next prefill step."""
        n, key = len(x.input_ids), (len(x.input_ids), sdpa)
        b, w = x.block_tables.shape
        if self.capture:
            i, staging, done = self.staging.take()
        else:
            staging = self.host_inputs
        ids, pos, slots, rows, cu, lens, tables = self._views(staging.numpy(), n)
        ids[:], pos[:], slots[:] = x.input_ids, x.positions, x.slot_mapping
        rows[: len(x.logit_rows)] = x.logit_rows
        cu[: b + 1], cu[b + 1 :] = x.cu_seqlens_q, x.cu_seqlens_q[-1]
        lens[:b], tables[:b, :w] = x.context_lens, x.block_tables
        # rows past b of the block tables are never read (cu_seqlens_q gives them no query)
        used = self._layout(n)[-2] + b * self.width
        if self.capture:
            compute = torch.cuda.current_stream()
            with torch.cuda.stream(self.copy_stream):
                self.copy_stream.wait_event(self.read[i])  # its last reader, 2 steps ago, is done
                self.device_staging[i][:used].copy_(staging[:used], non_blocking=True)
                done.record(self.copy_stream)
            compute.wait_event(done)
            graph_inputs(self.device_staging[i], self.inputs, used, input_ids)
            self.read[i].record(compute)
        else:
            self.inputs[:used].copy_(staging[:used])
            if input_ids is not None:
                self.inputs[: len(input_ids)] = input_ids
        self.steps[key]()
        at = self._layout(n)[3]
        return self.hidden[key], self.inputs[at : at + len(x.logit_rows)]
