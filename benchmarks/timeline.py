"""The GPU's idle time over nano-vllm's whole workload (`python -m nanoserve.benchmarks.timeline`):
the throughput run of benchmarks.engine under torch.profiler (device activity only), its kernels
and copies laid on one timeline, and every gap between them by size, by the phase it falls in
(after a prefill-attention kernel or a decode one) and by the ops on either side.
"""

import argparse
import json
import random
import sys
import time

# gap sizes in µs: launch gaps inside a graph, copies between replays, host stalls
GAP_BINS = (1.0, 5.0, 20.0, 100.0, 1000.0)


def short_name(name: str) -> str:
    """A kernel or copy name cut to what tells it apart (templated cuBLAS names are long)."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")):
        return name.split(" (")[0]
    return name.split("(")[0].split("<")[0][:48]


def phase_of_kernel(name: str) -> str | None:
    """The step kind an attention kernel marks: its gaps until the next one belong to it."""
    low = name.lower()
    if "prefill" in low or "flash_fwd" in low or "varlen" in low:
        return "prefill"
    if "decode" in low:
        return "decode"
    return None


def gap_account(spans: list[tuple[float, float, str]], wall_us: float) -> dict:
    """spans: (start µs, end µs, name) of every kernel and copy -> busy time (their union), idle
    time, the gaps by size bin, by phase and by (before -> after) site, largest first."""
    spans = sorted(spans)
    if not spans:
        return dict(busy_s=0.0, idle_s=0.0, wall_s=round(wall_us / 1e6, 4))
    bins = {f"<{b:g}us": [0.0, 0] for b in GAP_BINS} | {f">={GAP_BINS[-1]:g}us": [0.0, 0]}
    phases: dict[str, list[float]] = {}
    sites: dict[str, list[float]] = {}
    busy, busy_until, phase = 0.0, spans[0][0], "prefill"
    prev = spans[0][2]
    for start, end, name in spans:
        gap = start - busy_until
        if gap > 0:
            label = next((f"<{b:g}us" for b in GAP_BINS if gap < b), f">={GAP_BINS[-1]:g}us")
            bins[label][0] += gap
            bins[label][1] += 1
            row = phases.setdefault(phase, [0.0, 0])
            row[0] += gap
            row[1] += 1
            if gap >= GAP_BINS[0]:
                key = f"{short_name(prev)} -> {short_name(name)}"
                site = sites.setdefault(key, [0.0, 0])
                site[0] += gap
                site[1] += 1
        busy += max(0.0, end - max(start, busy_until))
        busy_until = max(busy_until, end)
        prev = name
        phase = phase_of_kernel(name) or phase
    span_us = busy_until - spans[0][0]

    def rows(d: dict[str, list[float]], top: int | None = None) -> list[dict]:
        ordered = sorted(d.items(), key=lambda kv: -kv[1][0])[:top]
        return [dict(at=k, ms=round(v[0] / 1e3, 2), gaps=int(v[1])) for k, v in ordered]

    return dict(
        wall_s=round(wall_us / 1e6, 4),
        gpu_span_s=round(span_us / 1e6, 6),
        busy_s=round(busy / 1e6, 6),
        idle_s=round((span_us - busy) / 1e6, 6),
        idle_fraction_of_wall=round((wall_us - busy) / wall_us, 4) if wall_us else None,
        ops=len(spans),
        by_size=[dict(at=k, ms=round(v[0] / 1e3, 2), gaps=int(v[1])) for k, v in bins.items()],
        by_phase=rows(phases),
        sites=rows(sites, 12),
    )


def device_spans(prof) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of a profile's device kernels and copies."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    try:  # the profiler's raw events: far faster than prof.events() over ~10^6 of them
        return [
            (e.start_ns() / 1e3, e.end_ns() / 1e3, e.name())
            for e in prof.profiler.kineto_results.events()
            if e.device_type() == cuda
        ]
    except AttributeError:
        return [
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type == cuda
        ]


def measure(llm, prompts: list[list[int]], params: list) -> dict:
    """One throughput run unprofiled (its tok/s), then the same run profiled: the gap account."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nanoserve.benchmarks.engine import sync

    out_tokens = sum(p.max_tokens for p in params)
    sync(llm)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    sync(llm)
    plain = time.perf_counter() - t
    llm.block_manager.hash_to_block_id.clear()  # the profiled run computes its prompts again
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    res = dict(
        output_tokens=out_tokens,
        seconds=round(plain, 3),
        output_tok_s=round(out_tokens / plain),
        profiled_seconds=round(wall, 3),
    )
    return res | gap_account(device_spans(prof), wall * 1e6)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench timeline", description=__doc__)
    p.add_argument("--shape", default="qwen3-0.6b", help="Qwen3 shape (random weights)")
    p.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "fp8"], help="the engine's KV cache"
    )
    p.add_argument("--num-seqs", type=int, default=256, help="sequences of the workload")
    return p


def main(argv: list[str] | None = None) -> None:
    import tempfile
    from pathlib import Path

    from nanoserve.benchmarks.shapes import write_shape_dir
    from nanoserve.worker import LLM, SamplingParams

    args = build_parser().parse_args(argv)
    model = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-timeline-")))
    llm = LLM(str(model), load_format="dummy", kv_cache_dtype=args.kv_cache_dtype)
    try:
        rng = random.Random(0)  # benchmarks.engine's throughput workload: the same draws
        vocab = llm.model_config.vocab_size
        prompts = [
            [rng.randrange(vocab) for _ in range(rng.randint(100, 1024))]
            for _ in range(args.num_seqs)
        ]
        params = [
            SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rng.randint(100, 1024))
            for _ in prompts
        ]
        # warm-up: every prompt length once with other ids, so nothing compiles in the runs
        other = random.Random(1)
        llm.generate(
            [[other.randrange(vocab) for _ in p] for p in prompts],
            SamplingParams(max_tokens=2, ignore_eos=True),
            use_tqdm=False,
        )
        res = measure(llm, prompts, params)
    finally:
        llm.shutdown()
    print(json.dumps(dict(bench="timeline", model=args.shape, **res)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
