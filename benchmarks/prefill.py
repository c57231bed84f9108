"""Host time against GPU time of one prefill step (issue 19), and the time to first token of a
request alone, by prompt length. Prints JSON; figures, never pass/fail.

Host time: prepare_prefill + ModelRunner.execute (forward + LM head) returning, while the GPU is
held busy by a sleep kernel, so nothing the host does waits for the GPU; split by phase for a
graphed step (host_split_us). GPU time: CUDA events around the same step, whose kernels are all
queued before the GPU reaches the first one.

    python -m nanoserve.benchmarks.prefill [--model DIR | --shape qwen3-0.6b] [--enforce-eager]
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nanoserve.benchmarks.shapes import SHAPES, write_shape_dir
from nanoserve.worker.config import EngineConfig


def step_times(llm, prompt: list[int]) -> tuple[float, float]:
    """(host ms, GPU ms) of one prefill step of `prompt` (then its blocks are freed)."""
    import torch

    from nanoserve.worker import SamplingParams
    from nanoserve.worker.sequence import Sequence

    runner, bm = llm.model_runner, llm.block_manager
    seq = Sequence(prompt, SamplingParams())
    bm.allocate(seq)
    seq.num_scheduled_tokens = len(prompt) - seq.num_computed_tokens
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles: longer than any step's host time
    start.record()
    t0 = time.perf_counter()
    runner.execute(runner.prepare_prefill([seq]))
    host = (time.perf_counter() - t0) * 1e3
    end.record()
    torch.cuda.synchronize()
    bm.deallocate(seq)
    return host, start.elapsed_time(end)


def host_split_us(llm, prompt: list[int]) -> dict[str, float]:
    """µs of each host phase of one prefill step of `prompt` through a prefill graph, the GPU held
    busy (as step_times): prepare, load_inputs (pinned copy, casts, context), the graph's run (its
    buffer copies and the replay), the LM head of the last row, then one more replay of that graph
    alone (the launch's own cost; the SDPA graph where the step takes SDPA). {} where the step
    runs eagerly (no graph for it)."""
    import torch

    from nanoserve.worker import SamplingParams
    from nanoserve.worker.layers.context import get_context, reset_context
    from nanoserve.worker.runner.prefill_graph import takes_sdpa
    from nanoserve.worker.sequence import Sequence

    runner, bm = llm.model_runner, llm.block_manager
    graphs = getattr(runner, "prefill_graphs", None)
    seq = Sequence(prompt, SamplingParams())
    bm.allocate(seq)
    seq.num_scheduled_tokens = len(prompt) - seq.num_computed_tokens
    marks: list[float] = []
    try:
        x = runner.prepare_prefill([seq])
        n, sdpa = len(x.input_ids), takes_sdpa(x, runner.sdpa_lengths)
        if graphs is None or not graphs.can_run(n, sdpa):
            return {}
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles: the host never waits
        with torch.inference_mode():
            marks.append(time.perf_counter())
            x = runner.prepare_prefill([seq])
            marks.append(time.perf_counter())
            ids, positions, rows = runner.load_inputs(x)
            get_context().sdpa_prefill = sdpa
            marks.append(time.perf_counter())
            hidden = graphs.run(ids, positions, get_context())
            marks.append(time.perf_counter())
            reset_context()
            # as ModelRunner.execute: the LM head right after the graph's run (before 2026-12-06
            # it came after a second replay, which may have made its launches wait for queue room)
            runner.model.compute_logits(hidden[rows[:1]])
            marks.append(time.perf_counter())
            graphs.steps[n, sdpa]()
            marks.append(time.perf_counter())
        torch.cuda.synchronize()
    finally:
        reset_context()
        bm.deallocate(seq)
    names = ("prepare", "load_inputs", "graph_run", "lm_head", "replay_alone")
    return {k: round((b - a) * 1e6, 1) for k, a, b in zip(names, marks, marks[1:])}


def guarded(measure):
    """measure(), or its error as text: a diagnostic that fails keeps the run's other figures."""
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 - reported in the JSON, not raised
        return f"failed: {type(e).__name__}: {e}"[:200]


def median_split(llm, first: list[int], prompt) -> dict | str:
    """The median µs of each host phase over 5 graphed steps (after `first`, a warm-up)."""

    def measure() -> dict:
        host_split_us(llm, first)
        splits = [host_split_us(llm, prompt(len(first))) for _ in range(5)]
        return {k: statistics.median(s[k] for s in splits) for k in splits[0]}

    return guarded(measure)


def ttft_ms(llm, prompt: list[int]) -> float:
    import torch

    from nanoserve.worker import SamplingParams

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False
    )
    return (time.perf_counter() - t0) * 1e3


def kernel_account(llm, prompt, n: int, steps: int = 5) -> dict:
    """torch.profiler over `steps` prefill steps of one fresh n-token prompt (as step_times: the
    step's own kernels, graphed where a bucket holds it): per kernel class the GPU µs a step
    against the class's bound (GEMMs at the FLOP peak, attention's causal FLOPs), the largest
    kernels and each step's GPU span: where a long prompt's TTFT goes on the GPU."""
    from torch.profiler import ProfilerActivity, profile

    from nanoserve.benchmarks.kernel_classes import (
        class_rows,
        kernel_events,
        kernel_rows,
        tally,
    )
    from nanoserve.benchmarks.step_cost import BF16, Cost, Shape, step_cost

    step_times(llm, prompt(n))  # warm
    seq: list = []  # (start, name, µs) of every kernel of the profiled steps
    spans: list = []  # (start, end, name)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step_times(llm, prompt(n))
    kernel_events(p, True, seq, spans)
    held = ("sleep", "spin_kernel")  # step_times' GPU hold, not the step's
    seq = [e for e in seq if not any(h in e[1].lower() for h in held)]
    spans = [e for e in spans if not any(h in e[2].lower() for h in held)]
    classes, kernels = tally(seq, steps)
    c = llm.model_runner.model_config
    shape = Shape(
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    )
    # the layers' GEMMs at the FLOP peak, plus the LM head of the last row (its weights' bytes)
    gemm = (
        Cost(0, 2 * n * shape.linear_params).bound_s + Cost(shape.lm_head_params * BF16, 0).bound_s
    )
    # step_cost's causal QK^T and PV: its FLOPs less the GEMMs' (the last row's LM head)
    linear_flops = 2 * n * shape.linear_params + 2 * shape.lm_head_params
    attn_flops = step_cost(shape, [(0, n)], sampled=1).flops - linear_flops
    bounds = {"gemm": 1e6 * gemm, "attention": 1e6 * Cost(0, attn_flops).bound_s}
    # each step's GPU span, first kernel's start to last kernel's end (steps apart: the holds)
    walls, spans = [], sorted(spans)
    first = 0
    for i in range(1, len(spans) + 1):
        if i == len(spans) or spans[i][0] - spans[i - 1][1] > 20_000:
            walls.append(max(e for _, e, _ in spans[first:i]) - spans[first][0])
            first = i
    return dict(
        prompt_tokens=n,
        gpu_busy_us=round(sum(r["us"] for r in classes.values()), 1),
        gpu_span_us=[round(w, 1) for w in walls],  # busy + the GPU's gaps inside each step
        classes=class_rows(classes, bounds),
        kernels=kernel_rows(kernels, steps, 14),
    )


def profile_steps(llm, prompt, n: int, steps: int) -> None:
    """cProfile of `steps` prefill steps of n-token prompts: the top functions by own time and by
    cumulative time, per step (the GPU is held busy, so host time is all that is measured)."""
    import cProfile
    import pstats

    step_times(llm, prompt(n))  # warm
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step_times(llm, prompt(n))
    profiler.disable()
    stats = pstats.Stats(profiler)
    for key in ("tottime", "cumulative"):
        print(f"--- {steps} prefill steps of {n} tokens, by {key}")
        stats.sort_stats(key).print_stats(25)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nanoserve bench prefill-step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="", help="a Qwen3 checkpoint directory (default: --shape)")
    p.add_argument(
        "--shape",
        default="qwen3-0.6b",
        choices=sorted(SHAPES),
        help="Qwen3 shape of the random weights without --model (default: qwen3-0.6b)",
    )
    p.add_argument("--lengths", default="37,600,1500,4000", help="prompt lengths, comma-separated")
    p.add_argument(
        "--repeats", type=int, default=10, help="timed runs per prompt length (default: 10)"
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (decode, prefill)")
    p.add_argument(
        "--prefill-sdpa-min-tokens",
        type=int,
        default=EngineConfig().prefill_sdpa_min_tokens,
        help="EngineConfig.prefill_sdpa_min_tokens: one prompt of at least this many tokens "
        "attends with torch's SDPA (0: the Triton kernel; default: the engine's)",
    )
    p.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="instead: cProfile N prefill steps of the first length (the GPU kept busy, as for the "
        "host time) and print where their host time goes, by function",
    )
    p.add_argument(
        "--kernels",
        type=int,
        default=0,
        metavar="N",
        help="also: a per-kernel-class account of an N-token prompt's prefill step on the GPU "
        "(torch.profiler; `kernel_account` in the JSON)",
    )
    p.add_argument(
        "--served-defaults",
        action="store_true",
        help="the engine as `nanoserve serve` starts it (EngineConfig's max_num_seqs, step "
        "tokens and max_model_len) instead of 64 sequences, 8,192-token steps and --max-model-len: "
        "its start-up by phase",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="max prompt + completion tokens of a sequence (default: 8192)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks.prefill needs CUDA")
    from nanoserve.worker import LLM

    kw: dict = dict(
        enforce_eager=args.enforce_eager, prefill_sdpa_min_tokens=args.prefill_sdpa_min_tokens
    )
    if not args.served_defaults:  # this benchmark's own, smaller engine
        kw.update(max_model_len=args.max_model_len, max_num_seqs=64, max_num_batched_tokens=8192)
    started = time.perf_counter()
    if args.model:
        llm = LLM(args.model, **kw)
    else:
        model = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-bench-")))
        llm = LLM(model, load_format="dummy", **kw)
    start_s = time.perf_counter() - started
    rng = random.Random(0)
    vocab = llm.model_runner.model_config.vocab_size - 1000

    def prompt(n: int) -> list[int]:  # distinct random prompts: no prefix-cache hits
        return [rng.randrange(vocab) for _ in range(n)]

    if args.cprofile:
        profile_steps(llm, prompt, int(args.lengths.split(",")[0]), args.cprofile)
        return
    rows = []
    for n in (int(v) for v in args.lengths.split(",")):
        first_ttft = ttft_ms(llm, prompt(n))
        steps = [step_times(llm, prompt(n)) for _ in range(args.repeats)]
        host = statistics.median(h for h, _ in steps)
        gpu = statistics.median(g for _, g in steps)
        ttft = statistics.median(ttft_ms(llm, prompt(n)) for _ in range(args.repeats))
        rows.append(
            dict(
                prompt_tokens=n,
                host_split_us=median_split(llm, prompt(n), prompt),
                host_ms=round(host, 3),
                gpu_ms=round(gpu, 3),
                host_share_of_step=round(host / max(host, gpu), 3),
                host_over_gpu=round(host / gpu, 3),
                ttft_first_ms=round(first_ttft, 2),
                ttft_median_ms=round(ttft, 2),
            )
        )
    runner = llm.model_runner
    account = guarded(lambda: kernel_account(llm, prompt, args.kernels)) if args.kernels else None
    print(
        json.dumps(
            dict(
                model=args.model or args.shape,
                enforce_eager=args.enforce_eager,
                prefill_graphs=getattr(runner, "prefill_graphs", None) is not None,
                sdpa_prompt_lengths=list(getattr(runner, "sdpa_lengths", (0, 0))),
                prefill_buckets=getattr(runner, "prefill_buckets", None),
                engine_start_s=round(start_s, 1),
                # the model runner's part of it, by phase (runner.start_clock)
                start_phases_s=runner.start_clock.phases,
                start_kernels=runner.start_clock.kernels,  # Triton specialisations by phase
                start_gc_s=runner.start_clock.gc_s,
                # each graph runner's warm-up forwards against its captures (runner.graph_capture)
                capture_times={
                    kind: vars(graphs.capture_times)
                    for kind, graphs in (
                        ("decode", getattr(runner, "graphs", None)),
                        ("prefill", getattr(runner, "prefill_graphs", None)),
                    )
                    if graphs is not None
                },
                cuda_graph_mib=round(getattr(runner, "graph_memory_bytes", 0) / 2**20),
                gpu=torch.cuda.get_device_name(),
                steps=rows,
                kernel_account=account,
            ),
            indent=1,
        )
    )
    llm.shutdown()


if __name__ == "__main__":
    main()
