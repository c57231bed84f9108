"""Runs the model for one scheduled batch: builds input tensors from the Sequences, forwards the Qwen3
model (decode through captured CUDA graphs), samples, and returns one token id per sequence.

Owns the weights and the KV cache of its rank. Under tensor parallelism rank 0's runner drives the
others through worker.tp.runner (every rank forwards the same batch; only rank 0 samples).
"""

import logging
import math
import os
from collections.abc import Callable

import numpy as np
import torch

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.layers.attention import FP8_KV_DTYPE, Attention
from nanoserve.worker.layers.context import get_context, reset_context
from nanoserve.worker.layers.distributed import init_symmetric_all_reduce
from nanoserve.worker.layers.layernorm import RMSNorm
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.loader import load_model
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM, Qwen3MLP
from nanoserve.worker.runner.cuda_graph import CudaGraphRunner
from nanoserve.worker.runner.device import (
    init_dummy_weights,
    prehash_triton,
    resolve_attention_backend,
    resolve_device,
    resolve_dtype,
)
from nanoserve.worker.runner.host_copy import PinnedRing, load_step, to_device, to_host_async
from nanoserve.worker.runner.kv_cache import make_kv_cache
from nanoserve.worker.runner.logprobs import (
    PROMPT_CHUNK_ROWS,
    PromptLogprobs,
    PromptRows,
    StepLogprobs,
)
from nanoserve.worker.runner.lookahead import (
    Foreseen,
    foreseen_logits,
    next_decode_inputs,
    planned_inputs,
)
from nanoserve.worker.runner.prefill_graph import PrefillGraphRunner, prefill_buckets, takes_sdpa
from nanoserve.worker.runner.prepare import prepare_decode, prepare_prefill
from nanoserve.worker.runner.sampler import SamplingTensors, sample
from nanoserve.worker.runner.sampling_inputs import SamplingInputs
from nanoserve.worker.runner.start_clock import StartClock
from nanoserve.worker.runner.step_inputs import (
    CMD_STEP_AHEAD,
    StepInputs,
    max_message_words,
)
from nanoserve.worker.runner.warmup import capture_and_compile, sdpa_prefill_range
from nanoserve.worker.sequence import NextStep, Sequence

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self, config: EngineConfig, model_config: ModelConfig, rank: int = 0, world_size: int = 1
    ):
        if config.compile_cache_dir:  # before the first kernel compiles; the ranks inherit it
            os.environ["TRITON_CACHE_DIR"] = os.path.abspath(config.compile_cache_dir)
        self.config, self.model_config = config, model_config
        self.rank, self.world_size = rank, world_size
        self.block_size = config.kvcache_block_size
        base = resolve_device(config.device)
        self.device = torch.device("cuda", rank) if base.type == "cuda" else base
        self.start_clock = clock = StartClock(self.device)
        # (lru-cached: the first kernel, after the join below, finds it done)
        triton_hashed = prehash_triton() if self.device.type == "cuda" else lambda: None
        with clock.phase("device"):  # CUDA's context is made here
            self.dtype = resolve_dtype(config.dtype, self.device)
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
        backend = resolve_attention_backend(config.attention_backend, self.device, self.block_size)
        # fp8: e4m3 with per-tensor scales (Attention.k_scale / v_scale), half the bytes of bf16
        self.kv_dtype = FP8_KV_DTYPE if config.kv_cache_dtype == "fp8" else self.dtype
        if self.kv_dtype == FP8_KV_DTYPE and backend == "flash_attn":
            raise ValueError("kv_cache_dtype: fp8 needs attention_backend triton or torch")
        self.max_model_len = model_config.max_len(config.max_model_len)
        self.max_num_blocks_per_seq = math.ceil(self.max_model_len / self.block_size)

        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        with clock.phase("model"), torch.device(self.device):
            self.model = Qwen3ForCausalLM(model_config)
        torch.set_default_dtype(default_dtype)
        with clock.phase("weights"):
            if config.load_format == "dummy":
                init_dummy_weights(self.model, config.seed)
            else:
                progress = config.load_progress_bar if rank == 0 else False
                load_model(self.model, config.model, progress)
        self.model.eval()
        if self.device.type == "cuda" and world_size > 1 and config.custom_all_reduce:
            # the largest decode step's activations; prefill's bigger messages stay on NCCL
            max_rows = min(config.max_num_seqs, 512)
            max_bytes = max_rows * model_config.hidden_size * self.dtype.itemsize
            init_symmetric_all_reduce(self.device, max_bytes, self.dtype, max_rows)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        for layer in self.attention_layers:
            layer.backend = backend
        for m in self.model.modules():  # the decode row's fused kernels, where asked for
            if isinstance(m, (RMSNorm, Qwen3MLP, Attention)):
                m.fuse_decode = config.decode_fusions
        with clock.phase("kv_cache"):
            triton_hashed()  # the cache's sizing runs the first kernels
            self.kv_cache = make_kv_cache(
                config,
                self.model,
                self.attention_layers,
                self.kv_dtype,
                self.device,
                self.max_model_len,
                world_size,
            )
        self.num_kvcache_blocks = self.kv_cache.shape[2]
        # prompt-logprob rows per LM-head call (the cache sizing above left room for this many)
        self.prompt_chunk_rows = PROMPT_CHUNK_ROWS
        # prefill steps are padded to token-count buckets whether or not graphs run them, so eager
        # and graphs run the same GEMM shapes (greedy identity); TP ranks prefill eagerly
        max_graph_tokens = min(config.max_num_batched_tokens, config.prefill_graph_max_tokens)
        use_buckets = backend == "triton" and world_size == 1
        self.prefill_buckets = prefill_buckets(max_graph_tokens) if use_buckets else []
        self.graphs: CudaGraphRunner | None = None
        self.prefill_graphs: PrefillGraphRunner | None = None
        # what capturing the CUDA graphs took (warmup.capture_and_compile)
        self.graph_memory_bytes = 0
        self.sdpa_lengths = sdpa_prefill_range(self, backend)  # prompt lengths SDPA attends
        self.sample_generator = torch.Generator(self.device).manual_seed(config.seed)
        self.sampling = SamplingInputs(
            self.device, model_config.vocab_size, model_config.eos_token_ids
        )
        # set by TensorParallelRunner on rank 0: sends each StepInputs out
        self.publish: Callable[[np.ndarray], None] | None = None
        # decode lookahead (worker.runner.lookahead): on by default on CUDA, with any number of
        # ranks (8B at tp=2 on two H200s: 3.93 -> 3.67 ms a token at batch 1)
        lookahead = config.decode_lookahead
        self.lookahead = self.device.type == "cuda" if lookahead is None else lookahead
        self.foreseen: Foreseen | None = None
        self.num_foreseen_steps = 0  # decode steps whose logits came from a foreseen forward
        self.num_forwards = 0  # every execute(): the foreseen logits must be taken before the next
        self.on_rank_death = None  # tensor parallelism only (TensorParallelRunner)
        if self.device.type == "cuda":
            max_blocks = self.max_num_blocks_per_seq
            words = max_message_words(
                config.max_num_batched_tokens, config.max_num_seqs, max_blocks
            )
            self.pinned = PinnedRing(words, torch.long)
            capture_and_compile(self, backend)
        if rank == 0:
            logger.info("model runner started in %s", clock.summary())

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV-cache block over every layer (K and V)."""
        return self.kv_cache.nbytes // self.num_kvcache_blocks

    # ---- inputs ---------------------------------------------------------------------------------

    def prepare_prefill(self, seqs: list[Sequence]) -> StepInputs:
        return self._prepare_prefill(seqs)[0]

    def _prepare_prefill(self, seqs: list[Sequence]) -> tuple[StepInputs, PromptRows | None]:
        return prepare_prefill(seqs, self.block_size, self.prefill_buckets, self.prompt_chunk_rows)

    def prepare_decode(self, seqs: list[Sequence]) -> StepInputs:
        return prepare_decode(seqs, self.block_size)

    def load_inputs(
        self, x: StepInputs, msg: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step's (ids, positions, logit rows) on the device, its attention context set."""
        pinned = self.pinned if self.device.type == "cuda" else None
        flash = self.attention_layers[0].backend == "flash_attn"
        return load_step(x, msg, self.device, pinned, flash)

    @torch.inference_mode()
    def execute(
        self,
        x: StepInputs,
        msg: np.ndarray | None = None,
        input_ids: torch.Tensor | None = None,
        prompt: PromptLogprobs | None = None,
    ) -> torch.Tensor | None:
        """Forward one step on this rank; returns the (S, vocab) logits of its sampled rows, the
        first S = R - x.num_prompt_rows logit rows (None when S = 0). input_ids: the step's token
        ids as a device tensor, overriding x.input_ids (lookahead). The prompt rows' logits go to
        `prompt` (rank 0) a chunk at a time; the other ranks compute and drop them (their
        all-gathers pair with rank 0's)."""
        self.num_forwards += 1
        if not x.is_prefill and self.graphs is not None and self.graphs.can_run(len(x.input_ids)):
            return self.graphs.run(x, input_ids)  # decode: one copy in, one replay (+ LM head)
        ids, positions, rows = self.load_inputs(x, msg)
        ids = ids if input_ids is None else input_ids
        sdpa = get_context().sdpa_prefill = takes_sdpa(x, self.sdpa_lengths)
        graphs = self.prefill_graphs if x.is_prefill else None
        if graphs is not None and graphs.can_run(len(ids), sdpa):
            # the step's inputs copied into the bucket's buffers, one replay
            hidden = graphs.run(ids, positions, get_context())
        else:
            hidden = self.model(ids, positions)
        reset_context()
        num_sampled = len(x.logit_rows) - x.num_prompt_rows
        for start in range(0, x.num_prompt_rows, max(x.prompt_chunk_rows, 1)):
            # (C, hidden) -> (C, vocab): at most prompt_chunk_rows rows of logits at a time
            chunk = rows[num_sampled + start : num_sampled + start + x.prompt_chunk_rows]
            logits = self.model.compute_logits(hidden[chunk])
            if prompt is not None:
                prompt.add(start, logits)
            del logits
        if num_sampled == 0:
            return None
        if num_sampled < hidden.shape[0] or x.num_prompt_rows:
            hidden = hidden[rows[:num_sampled]]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()  # the cache is an inference tensor
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of shared KV blocks (n > 1), before the forward that writes into the
        copies: every layer's K and V of each (source, destination) pair, one gather-scatter.
        Viewed as bytes: index_put has no kernel for every KV dtype (fp8)."""
        cache = self.kv_cache.view(torch.uint8)
        src = to_device([s for s, _ in copies], self.device)
        dst = to_device([d for _, d in copies], self.device)
        cache[:, :, dst] = cache[:, :, src]

    def prepare_sample(self, seqs: list[Sequence]) -> SamplingTensors:
        return self.sampling.prepare(seqs)

    def release(self, seq: Sequence) -> None:
        """Forget per-request state of a finished or aborted sequence."""
        self.sampling.release(seq)

    def close(self) -> None:
        """Drop the CUDA graphs: their captured collectives pin the communicators, which a
        tensor-parallel teardown then cannot free (TensorParallelRunner stops the ranks)."""
        self.graphs = self.prefill_graphs = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def kill(self) -> None:
        """Before a fatal exit (TensorParallelRunner kills its ranks)."""

    def explain(self, exc: BaseException) -> BaseException:
        """The error to report for a failed step (TensorParallelRunner names a dead rank)."""
        return exc

    # ---- step ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self,
        seqs: list[Sequence],
        is_prefill: bool,
        lookahead: bool = False,
        plan: Callable[[], NextStep | None] | None = None,
    ) -> list[int | None]:
        """Forward one batch; returns the sampled id per sequence (None for a non-final chunk).
        lookahead: the caller expects the next step to decode the same sequences (nothing waits);
        plan: schedules the next step (lookahead_prompts), called once this step's forward is
        launched; the step it gives is forwarded ahead."""
        prompt = None
        if is_prefill:
            x, prompt_rows = self._prepare_prefill(seqs)
            if prompt_rows is not None:  # the last logit rows are prompt positions
                prompt = PromptLogprobs(prompt_rows, self.device)
        else:
            x = prepare_decode(seqs, self.block_size)
        logits = self._take_foreseen(seqs, x)
        if logits is None:
            msg = None
            if self.publish is not None:
                msg = x.encode()
                self.publish(msg)  # the other tensor-parallel ranks run the same step
            logits = self.execute(x, msg, prompt=prompt)
        if logits is None:  # no sequence samples (mid-prompt chunks), maybe prompt rows
            lp = StepLogprobs.compute(torch.empty(0), torch.empty(0), [], None, prompt)
            if lp is not None:
                lp.finish([])  # a blocking copy: no sampled ids to wait for
            return [None] * len(seqs)
        planned = plan() if plan is not None and self.uses_lookahead else None
        done = [i for i, seq in enumerate(seqs) if seq.samples_this_step]
        sampled = seqs if len(done) == len(seqs) else [seqs[i] for i in done]
        t = self.prepare_sample(sampled)
        ids = sample(logits, t, self.sample_generator)  # (R,) on the device
        # before the step forwarded ahead replays the graph whose output `logits` may view
        lp = StepLogprobs.compute(logits, ids, sampled, t, prompt)
        if lp is not None:
            lp.start_copy()
        # the next step's inputs are made while the GPU samples this one (nothing above waits)
        nxt: tuple[np.ndarray, StepInputs] | None = None  # the inputs forwarded ahead
        ahead: list[int] = []  # their sequences' ids
        if lookahead and self.uses_lookahead and not is_prefill:
            nxt = next_decode_inputs(x, seqs, self.block_size, self.max_model_len)
            ahead = [seqs[i].seq_id for i in nxt[0]] if nxt is not None else ahead
        elif planned is not None:
            nxt = planned_inputs(planned, sampled, self.block_size, self.prefill_buckets)
            ahead = [s.seq_id for s in planned.seqs]
        token_ids = ids.tolist() if nxt is None else self._forward_ahead(*nxt, ahead, ids)
        if lp is not None:
            lp.finish(token_ids)
        out: list[int | None] = [None] * len(seqs)
        for i, token_id in zip(done, token_ids):
            out[i] = token_id
        return out

    @property
    def uses_lookahead(self) -> bool:
        """Decode lookahead is on (under tensor parallelism rank 0 publishes the step forwarded ahead
        and broadcasts its sampled ids to the other ranks)."""
        return self.lookahead

    @property
    def holds_foreseen(self) -> bool:
        """A decode step forwarded ahead waits to be taken by the next run (LLMEngine then
        schedules that decode step alone: admitting a prompt into it would drop the forward)."""
        return self.foreseen is not None

    def _take_foreseen(self, seqs: list[Sequence], x: StepInputs) -> torch.Tensor | None:
        """The logits of x from the step forwarded ahead, when it foresaw x."""
        f, self.foreseen = self.foreseen, None
        logits = foreseen_logits(f, self.num_forwards, seqs, x, self.block_size)
        self.num_foreseen_steps += logits is not None
        return logits

    def _forward_ahead(
        self, rows: np.ndarray, nxt: StepInputs, ahead: list[int], ids: torch.Tensor
    ) -> list[int]:
        """Start copying step N's ids (R,) to the host, forward step N+1 on those of `rows` (its
        first tokens; a planned step's prompt ids follow), then wait for the copy: the GPU computes
        N+1 while the host processes N. ahead: N+1's sequence ids."""
        if self.device.type == "cuda":
            host, copied = to_host_async(ids)
        next_ids = ids if len(rows) == len(ids) else ids[to_device(rows, ids.device)]
        if nxt.is_prefill:  # the decodes' ids over the first rows, the prompts' from the host
            next_ids = torch.cat([next_ids, to_device(nxt.input_ids[len(rows) :], ids.device)])
        msg = None
        if self.publish is not None:  # the other ranks forward the same step on these ids
            msg = nxt.encode(CMD_STEP_AHEAD)
            self.publish(msg)
            torch.distributed.broadcast(next_ids, src=0)
        logits = self.execute(nxt, msg, input_ids=next_ids)
        assert logits is not None  # the inputs forwarded ahead give >= 1 row a logit row
        self.foreseen = Foreseen(ahead, nxt, logits, self.num_forwards)
        if self.device.type == "cuda":
            copied.synchronize()
            token_ids = host.tolist()
        else:
            token_ids = ids.tolist()
        if nxt.is_prefill:  # the take compares a planned step's tokens: its decodes' ids too
            nxt.input_ids[: len(rows)] = np.asarray(token_ids, dtype=np.int64)[rows]
        return token_ids
