"""Piecewise CUDA graphs for prefill steps: per token-count bucket, one graph per stretch of the model
between two attentions; the attentions run eagerly in between, since their grids follow the step's
sequence lengths (vLLM's piecewise graphs).

ModelRunner.prepare_prefill pads a step's tokens to a bucket (padded tokens have slot -1: they never
touch the KV cache; their rows are computed and never read). For a bucket of T tokens, graph 0 is
the embedding and layer 0 up to its attention, graph i the rest of layer i - 1 and layer i up to its
attention, graph L the rest of layer L - 1 and the final norm. Each graph writes its layer's q into
one static buffer the attention reads, and the attention writes one static buffer the next graph
reads. A step then costs L + 1 replays and L attention launches of host time instead of ~15 launches
a layer.
"""

import logging
import math
from typing import cast

import numpy as np
import torch

from nanoserve.worker.kernels.prefill_attention import prefill_block_q_lengths
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
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


def attention_warmup_steps(group: int, fp32: bool, block_size: int) -> list[StepInputs]:
    """One single-sequence prefill step for each tile size of the prefill attention (the one kernel
    parameter that follows a prompt's length): its slots -1 (nothing stored), keys read from block
    0. ModelRunner runs them at start so that no prompt compiles a kernel while serving."""
    steps = []
    for n in prefill_block_q_lengths(group, fp32):
        blocks = math.ceil(n / block_size)
        steps.append(
            StepInputs(
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
        )
    return steps


class PrefillGraphRunner:
    def __init__(
        self,
        model: Qwen3ForCausalLM,
        buckets: list[int],
        dtype: torch.dtype,
        device: torch.device,
        capture: bool = True,
    ):
        # an nn.ModuleList types its items as nn.Module
        self.layers = cast(list[Qwen3DecoderLayer], list(model.model.layers))
        self.embed, self.norm = model.model.embed_tokens, model.model.norm
        attn = self.layers[0].self_attn
        if not attn.attn.fuses_kv_store:
            raise ValueError("prefill graphs need the Triton backend with the KV cache allocated")
        self.buckets = buckets
        top = buckets[-1]
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.int32, device=device)
        width = attn.num_heads * attn.head_dim
        self.q = torch.zeros(top, width, dtype=dtype, device=device)  # graph i -> attention i
        self.o = torch.zeros(top, width, dtype=dtype, device=device)  # attention i -> graph i + 1
        # bucket -> its L + 1 steps: graph replays, or (capture=False: tests on CPU) the pieces run
        # eagerly, the same code the graphs captured
        self.steps: dict[int, list] = {}
        self.hidden: dict[int, torch.Tensor] = {}  # bucket -> (T, hidden) output of its last graph
        if not capture:
            self.steps = {n: self._pieces(n) for n in buckets}
            return
        pool = None
        for n in reversed(buckets):  # largest first: the smaller ones reuse its pool
            pool = self._capture(n, pool)
        # a graph's first replay uploads it to the GPU: here, not in a request's first token (the
        # static slots are still -1: nothing is stored)
        for steps in self.steps.values():
            for step in steps:
                step()
        torch.cuda.synchronize()
        logger.info("captured piecewise CUDA graphs for prefill token counts %s", buckets)

    def _pieces(self, n: int) -> list:
        """The L + 1 stretches of the forward for n tokens, as closures over the static buffers;
        the residual stream passes from one to the next in `carry`."""
        ids, pos, q_out, o = self.input_ids[:n], self.positions[:n], self.q[:n], self.o[:n]
        carry: dict[str, torch.Tensor] = {}

        def head(layer, hidden, residual):
            q, _, _, _, carry["residual"] = layer.pre_attention(pos, hidden, residual)
            q_out.copy_(q.flatten(1))

        def first():
            head(self.layers[0], self.embed(ids), None)

        def middle(i):
            hidden, residual = self.layers[i - 1].post_attention(o, carry["residual"])
            head(self.layers[i], hidden, residual)

        def last():
            hidden, residual = self.layers[-1].post_attention(o, carry["residual"])
            self.hidden[n], _ = self.norm(hidden, residual)

        return [first] + [lambda i=i: middle(i) for i in range(1, len(self.layers))] + [last]

    def _capture(self, n: int, pool):
        set_context(is_prefill=True, slot_mapping=self.slot_mapping[:n])
        pieces = self._pieces(n)
        for piece in pieces:  # eager once: compiles kernels, sizes cuBLAS workspaces
            piece()
        graphs = []
        for piece in pieces:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                piece()
            pool = pool or graph.pool()
            graphs.append(graph)
        self.steps[n] = [graph.replay for graph in graphs]  # (a bound replay keeps its graph)
        torch.cuda.synchronize()
        reset_context()
        return pool

    def can_run(self, num_tokens: int) -> bool:
        return num_tokens in self.steps

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
    ) -> torch.Tensor:
        """Forward a prefill step of a bucket's token count (the attention context already set);
        returns its (T, hidden) hidden states, a view valid until the next replay of that bucket."""
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        q, o = self.q[:n], self.o[:n]
        steps = self.steps[n]
        for layer, step in zip(self.layers, steps):
            step()  # graph i: the rest of layer i - 1, layer i up to its attention
            layer.self_attn.attn.attend_stored(q, o)
        steps[-1]()
        return self.hidden[n]
