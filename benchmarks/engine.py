"""`nanoserve bench`: figures, never pass/fail. Offline throughput on nano-vllm's workload, batch-1
decode latency, prefill throughput, and the CPU cost of one scheduler + block-manager step
(`nanoserve bench serving`: the same work through the gRPC services, nanoserve.benchmarks.serving).

Without --model the engine runs random weights (load_format=dummy) of a named Qwen3 shape.
"""

import argparse
import dataclasses
import importlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nanoserve.benchmarks.shapes import H200_SPEED_OF_LIGHT, SHAPES, write_shape_dir
from nanoserve.config import add_config_args, config_from_args
from nanoserve.worker.config import EngineConfig


def make_llm(args):
    """The LLM of the engine flags (EngineConfig's own); without --model, random weights of
    --shape (load_format dummy)."""
    from nanoserve.worker import LLM

    ns = argparse.Namespace(**vars(args))
    if not ns.model:
        out = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-bench-")))
        ns.model, ns.load_format = str(out), "dummy"
    settings = dataclasses.asdict(config_from_args(EngineConfig, ns))
    return LLM(settings.pop("model"), **settings)


def sync(llm) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_throughput(llm, args) -> dict:
    """nano-vllm's bench.py workload: 256 seqs, prompt/output lengths uniform in [100, 1024]."""
    from nanoserve.worker import SamplingParams

    rng = random.Random(0)
    vocab = llm.model_config.vocab_size
    n, lo, hi = args.num_seqs, args.min_len, args.max_len
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    out_lens = [rng.randint(lo, hi) for _ in range(n)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in out_lens]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    sync(llm)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    sync(llm)
    dt = time.perf_counter() - t
    out_tokens = sum(out_lens)
    res: dict[str, Any] = dict(
        output_tokens=out_tokens, seconds=round(dt, 3), output_tok_s=round(out_tokens / dt)
    )
    if args.breakdown:  # a second, instrumented run: where a step's time goes
        b = step_breakdown(llm)
        llm.generate(prompts[:n], params, use_tqdm=False)
        restore(b)
        res["ms_per_call"] = report_breakdown(b)
    sol = H200_SPEED_OF_LIGHT.get(args.shape) if not args.model else None
    if sol:
        res["fraction_of_h200_sol"] = round(out_tokens / dt / sol, 3)
    return res


def step_breakdown(llm, gpu_waits: bool = False) -> dict:
    """Wrap the engine's per-step stages with timers (ms per call, averaged over decode steps).
    gpu_waits: the waits for the GPU too (an event's synchronize: the sampled ids' copy to the
    host under lookahead; a tensor's tolist: the ids without it) and each CUDA graph's replay
    (its launch), so that an engine step less its waits is the host's own work. Process-wide:
    for a benchmark process only."""
    import collections

    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    wrapped: list[tuple[object, str, object]] = []  # (owner, name, original): restore()
    runner = getattr(llm.model_runner, "runner", llm.model_runner)

    def timed(obj, name, label):
        fn = getattr(obj, name)
        wrapped.append((obj, name, vars(obj).get(name)))  # its own, not an inherited one

        def wrapper(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            totals[label] += time.perf_counter() - t
            counts[label] += 1
            return out

        setattr(obj, name, wrapper)

    timed(llm.scheduler, "schedule", "schedule")
    timed(llm.scheduler, "postprocess", "postprocess")
    timed(runner, "prepare_decode", "prepare_decode")
    timed(runner, "prepare_sample", "prepare_sample")
    timed(runner, "run", "run (incl. GPU)")
    timed(llm, "step", "engine step")
    if gpu_waits:
        import torch

        timed(torch.cuda.Event, "synchronize", "wait: event synchronize")
        timed(torch.Tensor, "tolist", "wait: tensor tolist")
        timed(torch.cuda.CUDAGraph, "replay", "graph replay (launch)")
    return {"totals": totals, "counts": counts, "wrapped": wrapped}


def restore(b: dict) -> None:
    """Undo step_breakdown's timers: each class or instance gets back what it held itself, or
    loses the wrapper where it inherited the method."""
    for obj, name, original in reversed(b["wrapped"]):
        if original is not None:
            setattr(obj, name, original)
        else:
            delattr(obj, name)


def calls_per_step(b: dict) -> dict:
    """How often each timed stage ran per engine step."""
    steps = max(1, b["counts"].get("engine step", 0))
    return {k: round(v / steps, 2) for k, v in b["counts"].items()}


def report_breakdown(b: dict) -> dict:
    return {k: round(1000 * v / max(1, b["counts"][k]), 3) for k, v in b["totals"].items()}


LATENCY_REPEATS = 3


def bench_latency(llm, args) -> dict:
    """Batch-1 decode ms/token after a prompt of `context` tokens."""
    from nanoserve.worker import SamplingParams

    prompt = [random.Random(1).randrange(1000) for _ in range(args.context)]
    steps = args.decode_tokens
    # warm-up on the same prompt: both timed runs then find it in the prefix cache alike, and the
    # prefill kernels for its length are compiled
    llm.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    sync(llm)
    timings: dict[int, list[float]] = {1: [], steps + 1: []}
    # the difference removes the prefill time; interleaved repeats and their medians, since one
    # pair once gave a negative figure (-0.037 ms, H200 2026-12-01: a stall in the 1-token run)
    for _ in range(args.latency_repeats):
        for n, runs in timings.items():
            t = time.perf_counter()
            llm.generate(
                [prompt],
                SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                use_tqdm=False,
            )
            sync(llm)
            runs.append(time.perf_counter() - t)
    short, long = (statistics.median(timings[n]) for n in (1, steps + 1))
    # each repeat's pace too: a slow mode in some repeats (issue 29's one-stream probes) shows here
    runs = [round(1000 * (t - short) / steps, 3) for t in timings[steps + 1]]
    res: dict[str, Any] = dict(
        context=args.context,
        ms_per_token=round(1000 * (long - short) / steps, 3),
        ms_per_token_runs=runs,
    )
    if args.breakdown:  # one more run, instrumented: a batch-1 step's host work and its waits
        b = step_breakdown(llm, gpu_waits=True)
        llm.generate(
            [prompt],
            SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True),
            use_tqdm=False,
        )
        sync(llm)
        restore(b)
        res["ms_per_call"] = report_breakdown(b)
        res["calls_per_step"] = calls_per_step(b)
    return res


def bench_profile(llm, args) -> dict:
    """Batch-`profile_batch` decode under torch.profiler: wall vs GPU-busy time per step, and the
    kernels that fill a step (where the latency goes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nanoserve.worker import SamplingParams

    rng = random.Random(3)
    b, steps = args.profile_batch, 32
    prompts = [[rng.randrange(1000) for _ in range(args.context)] for _ in range(b)]
    sp = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up and prefix-cache the prompts
    for p in prompts:
        llm.add_request(p, sp)
    llm.step()  # the prefill (a prefix hit: only the last token)
    sync(llm)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        n = 0
        while not llm.is_finished():
            llm.step()
            n += 1
        sync(llm)
        wall = (time.perf_counter() - t) / n
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.device_time)
    busy = sum(sum(v) for v in kernels.values()) / n / 1000
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:14]
    return dict(
        batch=b,
        steps=n,
        wall_ms_per_step=round(1000 * wall, 3),
        gpu_busy_ms_per_step=round(busy, 3),
        kernels_per_step=round(sum(len(v) for v in kernels.values()) / n, 1),
        top_kernels_us_per_step={
            k[:60]: [round(sum(v) / n, 1), round(len(v) / n, 1)] for k, v in top
        },
    )


def bench_prefill(llm, args) -> dict:
    from nanoserve.worker import SamplingParams

    rng = random.Random(2)
    n = max(1, args.prefill_tokens // args.context)
    prompts = [[rng.randrange(1000) for _ in range(args.context)] for _ in range(n)]
    llm.generate(prompts[:1], SamplingParams(max_tokens=1), use_tqdm=False)
    llm.block_manager.hash_to_block_id.clear()  # no prefix hits between the runs
    sync(llm)
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    sync(llm)
    dt = time.perf_counter() - t
    return dict(prompts=n, context=args.context, prefill_tok_s=round(n * args.context / dt))


def bench_scheduler(args) -> dict:
    """CPU time of one schedule() + postprocess() with `num_seqs` running sequences (no model)."""
    from nanoserve.sampling import SamplingParams
    from nanoserve.worker.core.block_manager import BlockManager
    from nanoserve.worker.core.scheduler import Scheduler
    from nanoserve.worker.sequence import Sequence

    rng = random.Random(0)
    n = args.num_seqs
    bm = BlockManager(num_blocks=n * 8, block_size=256)
    sched = Scheduler(n, 1 << 30, 1 << 20, (151645,), bm)
    for _ in range(n):
        sched.add(
            Sequence(
                [rng.randrange(1000) for _ in range(rng.randint(100, 1024))],
                SamplingParams(max_tokens=100_000, ignore_eos=True),
            )
        )
    seqs, _ = sched.schedule()  # the prefill step
    sched.postprocess(seqs, [1] * len(seqs))
    steps = 1000
    t = time.perf_counter()
    for _ in range(steps):
        seqs, _ = sched.schedule()
        sched.postprocess(seqs, [7] * len(seqs))
    dt = (time.perf_counter() - t) / steps
    return dict(running=len(seqs), ms_per_step=round(1000 * dt, 4))


# `nanoserve bench NAME ...`: the benchmarks with their own flags -> (module, what it measures)
BENCHMARKS = {
    "serving": ("serving", "the gRPC path (worker, frontend) against the offline engine"),
    "attention": ("attention", "decode and prefill attention kernels (GPU)"),
    "gemm": ("gemm", "small-M linear layers: cuBLAS against the skinny GEMM kernel (GPU)"),
    "allreduce": ("allreduce", "tensor-parallel all-reduce: NCCL against one-shot (GPUs)"),
    "roofline": ("roofline", "each step's bytes and FLOPs against the H200's bounds"),
    "timeline": ("timeline", "the GPU's idle gaps over the throughput workload (GPU)"),
    "arrivals": ("arrivals", "Poisson arrivals straight into the engine: steps and token gaps"),
    "prefill-step": ("prefill", "host against GPU time of one prefill step, TTFT by length"),
    "metrics-cost": ("metrics_cost", "what recording a request and a /metrics scrape cost"),
    "sampling-step-cost": ("sampling_step_cost", "host cost of a step's sampling inputs"),
    "step-mailbox": ("step_mailbox", "host cost of the tensor-parallel step mailbox"),
    "frame-send": ("frame_send", "what sending a step's frame costs the engine core's loop"),
    "frontend-cost": ("frontend_cost", "the frontend's CPU per token, against a stand-in worker"),
    "worker-cost": ("worker_cost", "the worker's CPU per token, its model runner a stand-in"),
    "soak": ("soak", "mixed traffic for a while: memory, files, threads, KV blocks, p99 drift"),
    "gemm-split-k": ("gemm_split_k", "decode-row GEMMs: cuBLAS against the split-K kernel (GPU)"),
    "variants": ("variants", "throughput under each decode-kernel rule, one process each (GPU)"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nanoserve bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="more benchmarks, each with its own flags (`nanoserve bench NAME --help`):\n"
        + "\n".join(f"  {name:<19} {what}" for name, (_, what) in BENCHMARKS.items()),
    )
    p.add_argument(
        "what",
        nargs="*",
        default=["throughput", "latency", "prefill"],
        choices=["throughput", "latency", "prefill", "scheduler", "profile"],
        help="benchmarks to run, in order (default: throughput latency prefill)",
    )
    add_config_args(p, EngineConfig, title="engine settings (EngineConfig)")
    # the nano-vllm workload's batch (512 sequences) and lengths (prompt and output <= 1,024)
    p.set_defaults(max_num_seqs=512, max_model_len=4096)
    p.add_argument(
        "--shape",
        default="qwen3-0.6b",
        choices=sorted(SHAPES),
        help="Qwen3 shape of the random weights (load_format=dummy) without --model",
    )
    p.add_argument(
        "--num-seqs",
        type=int,
        default=256,
        help="throughput: requests; scheduler: running sequences",
    )
    p.add_argument(
        "--min-len", type=int, default=100, help="throughput: shortest prompt and output, in tokens"
    )
    p.add_argument(
        "--max-len", type=int, default=1024, help="throughput: longest prompt and output, in tokens"
    )
    p.add_argument(
        "--context", type=int, default=1024, help="latency, prefill, profile: prompt tokens"
    )
    p.add_argument("--decode-tokens", type=int, default=128, help="latency: decode steps timed")
    p.add_argument(
        "--latency-repeats",
        type=int,
        default=LATENCY_REPEATS,
        help="latency: timed runs (their median is the figure; each run's pace is listed)",
    )
    p.add_argument(
        "--prefill-tokens",
        type=int,
        default=65536,
        help="prefill: total prompt tokens (prompts of --context tokens)",
    )
    p.add_argument("--profile-batch", type=int, default=1, help="profile: decode batch size")
    p.add_argument("--json", action="store_true", help="one JSON line per benchmark")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="throughput, latency: rerun with timers around each stage of a step (latency: and "
        "around the waits for the GPU and the graph launches: the host's own work a step)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in BENCHMARKS:  # its own module and flags (torch only where it needs it)
        module = importlib.import_module(f"nanoserve.benchmarks.{BENCHMARKS[argv[0]][0]}")
        return module.main(argv[1:])
    args = build_parser().parse_args(argv)
    from nanoserve.log import setup_logging

    setup_logging("bench", "INFO")
    llm = None
    for what in args.what:
        if what == "scheduler":
            res = bench_scheduler(args)
        else:
            llm = llm or make_llm(args)
            res = {
                "throughput": bench_throughput,
                "latency": bench_latency,
                "prefill": bench_prefill,
                "profile": bench_profile,
            }[what](llm, args)
        label = (args.model or args.shape) + (" kv=fp8" if args.kv_cache_dtype == "fp8" else "")
        print(
            json.dumps({"bench": what, "model": label, "tp": args.tensor_parallel_size, **res})
            if args.json
            else f"{what:<11} {label} tp={args.tensor_parallel_size}: {res}",
            flush=True,
        )
    if llm is not None:
        llm.shutdown()


if __name__ == "__main__":
    main()
