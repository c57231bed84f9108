"""CUDA graphs for prefill steps: per token-count bucket, one graph of the whole forward, attention
included (the prefill attention finds its blocks from cu_seqlens_q on the device, so its grid
follows the bucket alone).

ModelRunner.prepare_prefill pads a step's tokens to a bucket (padded tokens have slot -1: they never
touch the KV cache; their rows are computed and never read). A step copies its inputs and its
attention metadata into static buffers sized for the bucket's most sequences (cu_seqlens_q padded
with its last entry: the rows past the step's sequences own no query block) and replays one graph:
a few copies and one launch of host time, against ~15 launches a layer eagerly. The buckets in
ModelRunner.sdpa_lengths (EngineConfig.prefill_sdpa_min_tokens up to the bucket of max_model_len)
have a second graph, for a step of one prompt with nothing cached, whose attention is torch's
SDPA (cuDNN) over the bucket's rows (takes_sdpa).
"""

import logging
import math
import time
from collections.abc import Callable
from typing import cast

import numpy as np
import torch

from nanoserve.worker.kernels.prefill_attention import prefill_block_q_lengths
from nanoserve.worker.layers.context import Context, reset_context, set_context
from nanoserve.worker.model.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
from nanoserve.worker.runner.graph_capture import CaptureTimes, capture_graph
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


def sdpa_buckets(buckets: list[int], lengths: tuple[int, int]) -> list[int]:
    """The buckets whose steps may take SDPA (lengths: takes_sdpa's): each gets an SDPA graph."""
    low, high = lengths
    return [n for n in buckets if low and low <= n <= high]


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
        """sdpa_lengths: ModelRunner.sdpa_lengths ((0, 0): none); its buckets (sdpa_buckets) also
        get an SDPA graph."""
        attn = cast(Qwen3DecoderLayer, model.model.layers[0]).self_attn.attn
        if not attn.fuses_kv_store:
            raise ValueError("prefill graphs need the Triton backend with the KV cache allocated")
        self.model, self.buckets, self.max_num_seqs = model, buckets, max_num_seqs
        self.device = device
        top = buckets[-1]
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.int32, device=device)
        # the attention's metadata, rows for the most sequences any bucket holds; all zeros
        # until a step: no query block, nothing read
        self.cu_seqlens_q = torch.zeros(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_num_seqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            max_num_seqs, max_blocks_per_seq, dtype=torch.int32, device=device
        )
        # (bucket, sdpa) -> (T, hidden) output of its graph
        self.hidden: dict[tuple[int, bool], torch.Tensor] = {}
        # (bucket, sdpa) -> one replay, or (capture=False: tests on CPU) the same forward eagerly
        self.steps: dict[tuple[int, bool], Callable[[], None]] = {}
        self.capture_times = CaptureTimes()  # stays empty without a capture
        # every bucket's graph, then an SDPA graph of each bucket in sdpa_lengths
        keys = [(n, False) for n in buckets]
        keys += [(n, True) for n in sdpa_buckets(buckets, sdpa_lengths)]
        if not capture:
            self.steps = {key: self._forward(*key) for key in keys}
            return
        pool = None
        # largest first (the smaller ones reuse its pool), a bucket's graph before its SDPA one
        for key in sorted(keys, key=lambda key: (-key[0], key[1])):
            pool = self._capture(key, pool)
        # a graph's first replay uploads it to the GPU: here, not in a request's first token (the
        # static slots are still -1 and cu_seqlens_q zeros: nothing is stored or attended)
        t = time.perf_counter()
        for step in self.steps.values():
            step()
        torch.cuda.synchronize()
        logger.info(
            "captured prefill CUDA graphs for token counts %s (SDPA graphs for %s): %s, first "
            "replays %.2f s",
            buckets,
            sdpa_buckets(buckets, sdpa_lengths) or "none",
            self.capture_times.summary(),
            time.perf_counter() - t,
        )

    def _forward(self, n: int, sdpa: bool) -> Callable[[], None]:
        """The forward of n tokens over the static buffers, its output kept in self.hidden; sdpa:
        a step of one prompt attended by torch's SDPA (its metadata unread: no batch rows)."""
        batch = min(n, self.max_num_seqs)  # a sequence has at least one token
        ids, pos = self.input_ids[:n], self.positions[:n]

        def forward() -> None:
            set_context(
                is_prefill=True,
                slot_mapping=self.slot_mapping[:n],
                cu_seqlens_q=self.cu_seqlens_q[: batch + 1],
                context_lens=self.context_lens[:batch],
                block_tables=self.block_tables[:batch],
                sdpa_prefill=sdpa,
            )
            self.hidden[n, sdpa] = self.model(ids, pos)
            reset_context()

        return forward

    def _capture(self, key: tuple[int, bool], pool):
        n, sdpa = key
        # an SDPA graph's bucket ran every other kernel of its forward at these shapes when its
        # graph was captured just before: only the SDPA call is new (cuDNN builds its plan for
        # the shape on the first one). On an H100 a whole forward's warm-up took 80-116 ms a
        # bucket, the call alone 38-60 ms: ~0.5-0.7 s less start-up over 13 buckets (2026-12-06).
        warmup = self._sdpa_warmup(n) if sdpa else None
        graph = capture_graph(self._forward(n, sdpa), pool, self.capture_times, warmup)
        self.steps[key] = graph.replay  # (a bound replay keeps its graph)
        return pool or graph.pool()

    def _sdpa_warmup(self, n: int) -> Callable[[], None]:
        """One SDPA call over n tokens of zeros laid out as a layer's are (q, k, v column views
        of one qkv row, Attention.sdpa_prefill's path): the call a step of n tokens makes."""
        attn = cast(Qwen3DecoderLayer, self.model.model.layers[0]).self_attn.attn
        heads, kv_heads, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        dtype = self.model.model.embed_tokens.weight.dtype

        def warmup() -> None:
            qkv = torch.zeros(n, (heads + 2 * kv_heads) * d, dtype=dtype, device=self.device)
            q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            attn.sdpa_prefill(q.view(n, heads, d), k.view(n, kv_heads, d), v.view(n, kv_heads, d))

        return warmup

    def can_run(self, num_tokens: int, sdpa: bool = False) -> bool:
        return (num_tokens, sdpa) in self.steps

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Forward a prefill step of a bucket's token count, its attention context `ctx` (set by
        ModelRunner.load_inputs; ctx.sdpa_prefill picks the SDPA graph); returns its (T, hidden)
        hidden states, a view valid until the next replay of that bucket."""
        n, key = input_ids.shape[0], (input_ids.shape[0], ctx.sdpa_prefill)
        cu, lens, tables = ctx.cu_seqlens_q, ctx.context_lens, ctx.block_tables
        assert ctx.slot_mapping is not None and cu is not None and lens is not None
        assert tables is not None
        b, w = tables.shape
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(ctx.slot_mapping)
        self.cu_seqlens_q[: b + 1].copy_(cu)
        self.cu_seqlens_q[b + 1 :].copy_(cu[b:].expand(self.max_num_seqs - b))
        self.context_lens[:b].copy_(lens)
        self.block_tables[:b, :w].copy_(tables)
        self.steps[key]()
        return self.hidden[key]
