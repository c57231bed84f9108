"""A CUDA runner's start-up, after its KV cache exists: the decode and prefill CUDA graphs captured
(with the device memory they take), then every kernel a step can reach compiled, or loaded from the
Triton cache, so that no request waits for a compile. ModelRunner.__init__ calls
capture_and_compile once, which runs the rest in order.
"""

import logging
import os
from collections.abc import Callable
from typing import Protocol

import torch

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.layers.attention import Attention
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from nanoserve.worker.runner.cuda_graph import CudaGraphRunner
from nanoserve.worker.runner.device import device_memory_used
from nanoserve.worker.runner.prefill_graph import (
    PrefillGraphRunner,
    attention_warmup_steps,
    one_prompt_step,
    pad_to_bucket,
    sdpa_buckets,
)
from nanoserve.worker.runner.start_clock import StartClock
from nanoserve.worker.runner.step_inputs import StepInputs

logger = logging.getLogger(__name__)


class StartingRunner(Protocol):
    """What this module reads and sets of a ModelRunner (which imports it)."""

    config: EngineConfig
    model: Qwen3ForCausalLM
    model_config: ModelConfig
    attention_layers: list[Attention]
    start_clock: StartClock
    prefill_buckets: list[int]
    world_size: int
    kv_dtype: torch.dtype
    dtype: torch.dtype
    device: torch.device
    block_size: int
    max_model_len: int
    max_num_blocks_per_seq: int
    sdpa_lengths: tuple[int, int]
    graphs: CudaGraphRunner | None
    prefill_graphs: PrefillGraphRunner | None
    graph_memory_bytes: int

    def execute(self, x: StepInputs) -> object: ...


@torch.no_grad()  # no autograd graph may hold on to the captured tensors
def capture_graphs(
    model: Qwen3ForCausalLM,
    config: EngineConfig,
    *,
    max_model_len: int,
    max_blocks_per_seq: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device,
    buckets: list[int],
    clock: StartClock,
    sdpa_lengths: tuple[int, int] = (0, 0),
) -> tuple[CudaGraphRunner, PrefillGraphRunner | None, int]:
    """(decode graphs, prefill graphs when there are buckets, the device bytes they take), each
    kind a phase of the start-up clock; the buckets in sdpa_lengths get an SDPA graph too."""
    used_before = device_memory_used(device)
    with clock.phase("decode_graphs"):  # with the kernels their warm-ups compile
        decode = CudaGraphRunner(
            model, config.max_num_seqs, max_model_len, max_blocks_per_seq, vocab_size, dtype, device
        )
    prefill = None
    if buckets:
        with clock.phase("prefill_graphs"):
            prefill = PrefillGraphRunner(
                model,
                buckets,
                config.max_num_seqs,
                max_blocks_per_seq,
                device,
                sdpa_lengths=sdpa_lengths,
            )
    # the graphs' private pools and fixed buffers (their share of the device's memory)
    return decode, prefill, device_memory_used(device) - used_before


@torch.no_grad()
def compile_prefill_attention(
    execute: Callable[[StepInputs], object],
    attn: Attention,
    fp32: bool,
    block_size: int,
    buckets: list[int],
    device: torch.device,
) -> None:
    """Each tile size of the prefill attention (its one length-bound constexpr), from a
    one-sequence step of slots -1 through `execute` (the graphs, once captured, where a bucket
    holds it)."""
    for x in attention_warmup_steps(attn.num_heads // attn.num_kv_heads, fp32, block_size):
        execute(pad_to_bucket(x, buckets))
    torch.cuda.synchronize(device)


@torch.no_grad()
def compile_step_kernels(vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """The Triton kernels a step runs outside the model's forward, in each specialisation a step
    reaches: the plain sampler all greedy and with temperatures (sample_rows' ALL_GREEDY), the
    seeded rows' noise, and the decode graphs' input fill without and with the sampled ids of
    lookahead. Without this the first requests served compiled them (H100, d537462: three
    specialisations while the first requests waited). Same dtypes as a step's: logits (2, V) in
    the model's dtype, sampled ids int64, graph inputs int32."""
    from nanoserve.worker.kernels.graph_inputs import graph_inputs
    from nanoserve.worker.kernels.sample_rows import sample_rows
    from nanoserve.worker.kernels.seeded_noise import fill_seeded_exponential

    logits = torch.zeros(2, vocab_size, dtype=dtype, device=device)
    generator = torch.Generator(device).manual_seed(0)
    sample_rows(logits, None)
    ids = sample_rows(logits, torch.tensor([0.0, 1.0], device=device), generator)
    rows = torch.arange(2, dtype=torch.int64, device=device)
    noise = torch.empty(2, vocab_size, dtype=torch.float32, device=device)
    fill_seeded_exponential(noise, rows, rows, rows)
    staged = torch.zeros(16, dtype=torch.int32, device=device)
    out = torch.empty_like(staged)
    graph_inputs(staged, out, len(staged))
    graph_inputs(staged, out, len(staged), ids)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sdpa_prefill_range(runner: StartingRunner, backend: str) -> tuple[int, int]:
    """The prompt lengths whose steps attend with torch's SDPA (runner.sdpa_lengths; (0, 0):
    none): EngineConfig.prefill_sdpa_min_tokens up to the bucket a prompt of max_model_len tokens
    pads to, or the largest (past it a step's length is its own: those keep the Triton kernel), on
    the Triton backend, one rank, a cache in the model's dtype (the rotated k the q/k-norm kernel
    leaves in place is what the cache holds). The range's buckets get SDPA graphs."""
    low, buckets = runner.config.prefill_sdpa_min_tokens, runner.prefill_buckets
    one_rank = backend == "triton" and runner.world_size == 1
    if not (low and one_rank and runner.kv_dtype == runner.dtype and buckets):
        return 0, 0
    longest = min(runner.max_model_len, buckets[-1])  # a bucket past it holds no one prompt
    high = next(b for b in buckets if b >= longest)
    return (low, high) if low <= high else (0, 0)


@torch.no_grad()
def arm_sdpa_prefill(runner: StartingRunner) -> None:
    """One eager step of each bucket in runner.sdpa_lengths that has no SDPA graph: cuDNN builds a
    plan per shape, so none is built while serving. (A captured bucket's plan was built by its
    capture's warm-up, its SDPA call, and PrefillGraphRunner replayed it once: nothing to arm.)"""
    graphs = runner.prefill_graphs
    for n in sdpa_buckets(runner.prefill_buckets, runner.sdpa_lengths):
        if graphs is not None and graphs.can_run(n, sdpa=True):
            continue
        # (a bucket past max_model_len: its block table as wide as the runner's; SDPA reads none)
        step = one_prompt_step(n, runner.config.kvcache_block_size, runner.max_num_blocks_per_seq)
        runner.execute(step)
    if runner.sdpa_lengths[0] and runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def capture_and_compile(runner: StartingRunner, backend: str) -> None:
    """A CUDA runner's CUDA graphs (decode, prefill) and every kernel a step can reach, compiled
    now (or loaded from the Triton cache) so that no request waits for a compile; each a phase of
    runner.start_clock."""
    clock = runner.start_clock
    if not runner.config.enforce_eager:  # phases decode_graphs, prefill_graphs
        runner.graphs, runner.prefill_graphs, runner.graph_memory_bytes = capture_graphs(
            runner.model,
            runner.config,
            max_model_len=runner.max_model_len,
            max_blocks_per_seq=runner.max_num_blocks_per_seq,
            vocab_size=runner.model_config.vocab_size,
            dtype=runner.dtype,
            device=runner.device,
            buckets=runner.prefill_buckets,
            clock=clock,
            sdpa_lengths=runner.sdpa_lengths,
        )
    # each tile size of the prefill attention, each a one-prompt step: on the Triton kernel
    sdpa, runner.sdpa_lengths = runner.sdpa_lengths, (0, 0)  # (SDPA would take a long one)
    with clock.phase("prefill_kernels"):
        if backend == "triton":
            compile_prefill_attention(
                runner.execute,
                runner.attention_layers[0],
                runner.dtype == torch.float32,
                runner.block_size,
                runner.prefill_buckets,
                runner.device,
            )
    runner.sdpa_lengths = sdpa
    with clock.phase("step_kernels"):  # sampling and the graphs' input fill
        compile_step_kernels(runner.model_config.vocab_size, runner.dtype, runner.device)
    with clock.phase("sdpa_plans"):  # (through the SDPA graphs, where captured)
        arm_sdpa_prefill(runner)
    logger.info(
        "kernels compiled (or loaded from %s) and graphs captured (%.0f MiB) in %.1f s",
        os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache"),
        runner.graph_memory_bytes / 2**20,
        sum(clock.phases.get(p, 0.0) for p in ("decode_graphs", "prefill_graphs"))
        + clock.phases["prefill_kernels"]
        + clock.phases["step_kernels"],
    )
