"""Roofline account of nano-vllm's workload (`python -m nanoserve.benchmarks.roofline`): the bytes
and FLOPs each engine step must move, its bound on an H200 (4.3 TB/s, 790 TFLOP/s measured), and on
the GPU the time each phase (prefill, full decode batches, the shrinking tail) and each kernel class
of a decode step at B=256 and B=16 takes against its bound. `--analytic` (any machine) prints the bounds
of the simulated schedule only.
"""

import argparse
import json
import random
import sys
import time

from nanoserve.benchmarks.shapes import SHAPES
from nanoserve.benchmarks.step_cost import (  # noqa: F401
    BF16,
    HBM_BYTES_S,
    PEAK_FLOP_S,
    VOCAB,
    Cost,
    Shape,
    step_cost,
)


def nano_vllm_workload(
    num: int = 256, lo: int = 100, hi: int = 1024, seed: int = 0
) -> list[tuple[int, int]]:
    """(prompt, output) lengths of `nanoserve bench throughput` (benchmarks.engine): the same
    draws in the same order (prompt ids are drawn in between)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num):
        p = rng.randint(lo, hi)
        for _ in range(p):
            rng.randrange(VOCAB)
        prompts.append(p)
    return [(p, rng.randint(lo, hi)) for p in prompts]


def simulate(
    work: list[tuple[int, int]], max_num_batched_tokens: int = 16384, max_num_seqs: int = 512
) -> list[dict]:
    """The steps of a prefill-first engine with room for every sequence: prompts chunked to the
    token budget, then one decode step per output token after the first while any sequence runs.
    Each step: {"items": [(past, new)], "sampled": n}."""
    steps: list[dict] = []
    items, budget, sampled = [], max_num_batched_tokens, 0
    for p, _ in work[:max_num_seqs]:
        done = 0
        while done < p:
            take = min(p - done, budget)
            items.append((done, take))
            done, budget = done + take, budget - take
            sampled += done == p
            if budget == 0:
                steps.append(dict(items=items, sampled=sampled))
                items, budget, sampled = [], max_num_batched_tokens, 0
    if items:
        steps.append(dict(items=items, sampled=sampled))
    for k in range(1, max(o for _, o in work)):
        # after the prefill's token, output token k + 1 comes from a step over p + k - 1 cached
        live = [(p + k - 1, 1) for p, o in work[:max_num_seqs] if o > k]
        steps.append(dict(items=live, sampled=len(live)))
    return steps


PHASES = ("prefill", "decode_full", "decode_shrinking", "decode_tail")


def phase_of(step: dict, full_batch: int, tail_batch: int = 16) -> str:
    """prefill (any step that computes more tokens than it has sequences: mixed ones too),
    decode_full (the largest batch), decode_shrinking, decode_tail (batch <= tail_batch: where
    launches and host time, not bytes, set the pace)."""
    items = step["items"]
    if sum(new for _, new in items) > len(items):
        return "prefill"
    if len(items) >= full_batch:
        return "decode_full"
    return "decode_tail" if len(items) <= tail_batch else "decode_shrinking"


def account(shape: Shape, steps: list[dict], tail_batch: int = 16) -> dict:
    """Per phase: steps, bytes, FLOPs, bound; with "seconds" in the steps, time and the fraction
    of the bound reached."""
    full = max((len(s["items"]) for s in steps if phase_of(s, 1 << 30) != "prefill"), default=0)
    phases: dict[str, dict] = {}
    for s in steps:
        c = step_cost(shape, s["items"], s.get("sampled"))
        p = phases.setdefault(
            phase_of(s, full, tail_batch),
            dict(steps=0, bytes=0.0, flops=0.0, bound_s=0.0, seconds=0.0, tokens=0),
        )
        p["steps"] += 1
        p["bytes"] += c.bytes
        p["flops"] += c.flops
        p["bound_s"] += c.bound_s
        p["seconds"] += s.get("seconds", 0.0)
        p["tokens"] += s.get("sampled", len(s["items"]))
    out = {}
    for name in PHASES:
        if name not in phases:
            continue
        p = phases[name]
        row = dict(
            steps=p["steps"],
            output_tokens=p["tokens"],
            gbytes=round(p["bytes"] / 1e9, 1),
            tflop=round(p["flops"] / 1e12, 2),
            bound_s=round(p["bound_s"], 6),
        )
        if p["seconds"]:
            row.update(
                seconds=round(p["seconds"], 4),
                fraction_of_bound=round(p["bound_s"] / p["seconds"], 3),
            )
        out[name] = row
    tokens = sum(p["tokens"] for p in phases.values())
    bound = sum(p["bound_s"] for p in phases.values())
    seconds = sum(p["seconds"] for p in phases.values())
    out["total"] = dict(
        output_tokens=tokens, bound_s=round(bound, 6), speed_of_light_tok_s=round(tokens / bound)
    )
    if seconds:
        out["total"].update(
            seconds=round(seconds, 4),
            tok_s=round(tokens / seconds),
            fraction_of_bound=round(bound / seconds, 3),
        )
    return out


# ------------------------------------------------------------------ measured on the GPU


def record_steps(llm) -> list[dict]:
    """Wraps the engine's schedule() and step(): each step's (cached, new) tokens per sequence, the
    sequences that sample, and the step's wall time. Returns the list it fills."""
    steps: list[dict] = []
    schedule, step = llm.scheduler.schedule, llm.step

    def recording_schedule(*a, **kw):
        out = schedule(*a, **kw)
        seqs = out[0]
        steps.append(
            dict(
                items=[(s.num_computed_tokens, s.num_scheduled_tokens) for s in seqs],
                sampled=sum(bool(getattr(s, "samples_this_step", True)) for s in seqs),
            )
        )
        return out

    def timed_step(*a, **kw):
        n, t = len(steps), time.perf_counter()
        out = step(*a, **kw)
        dt = time.perf_counter() - t
        target = steps[n] if len(steps) > n else (steps[-1] if steps else None)
        if target is not None:  # a step that scheduled nothing: its time goes to the last one
            target["seconds"] = target.get("seconds", 0.0) + dt
        return out

    llm.scheduler.schedule, llm.step = recording_schedule, timed_step
    return steps


def measure_phases(llm, shape: Shape, work: list[tuple[int, int]]) -> dict:
    """The throughput workload of benchmarks.engine, every step recorded: the phase account with
    measured time."""
    from nanoserve.benchmarks.engine import sync
    from nanoserve.worker import SamplingParams

    rng = random.Random(0)  # benchmarks.engine's throughput workload: the same ids and lengths
    vocab = llm.model_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(p)] for p, _ in work]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=o) for _, o in work]
    # warm-up: every prompt length once (other ids: no prefix hits), so no kernel compiles in the
    # timed run and the account is of the steady state
    other = random.Random(1)
    llm.generate(
        [[other.randrange(vocab) for _ in range(p)] for p, _ in work],
        SamplingParams(max_tokens=2, ignore_eos=True),
        use_tqdm=False,
    )
    steps = record_steps(llm)
    try:
        sync(llm)
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        sync(llm)
        wall = time.perf_counter() - t
    finally:  # the classes' own methods again
        del llm.scheduler.schedule, llm.step
    res = account(shape, [s for s in steps if s["items"]])
    res["total"]["wall_s"] = round(wall, 4)
    return res


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench roofline", description=__doc__)
    p.add_argument(
        "--shape",
        default="qwen3-0.6b",
        choices=sorted(SHAPES),
        help="Qwen3 shape (random weights, load_format=dummy)",
    )
    p.add_argument(
        "--analytic",
        action="store_true",
        help="bounds of the simulated schedule only: no engine, no GPU",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=16384,
        help="prefill token budget a step (as the engine's)",
    )
    p.add_argument("--max-num-seqs", type=int, default=512, help="most sequences a batch")
    p.add_argument(
        "--tail-batch",
        type=int,
        default=16,
        help="decode steps of at most this many sequences count as the tail",
    )
    p.add_argument(
        "--batches",
        default="256,16,128m",
        help="decode batches to profile per kernel; a trailing m: mixed contexts (100..2 x context)",
    )
    p.add_argument("--context", type=int, default=1024, help="profiled decode: tokens a sequence")
    p.add_argument(
        "--prefill-tokens",
        type=int,
        default=16384,
        help="profile a prefill-only step of this many new tokens per kernel (0: none)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "fp8"],
        help="the engine's KV cache (the bounds stay the bf16 cache's)",
    )
    p.add_argument(
        "--phases",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the whole workload for the per-phase account (--no-phases: only the profiles)",
    )
    p.add_argument(
        "--decode-fusions",
        action="store_true",
        help="the engine with EngineConfig.decode_fusions (a decode row's fused kernels)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line per part")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    shape = Shape.named(args.shape)
    work = nano_vllm_workload()
    out = []
    if args.analytic:
        steps = simulate(work, args.max_num_batched_tokens, args.max_num_seqs)
        out.append(
            dict(
                bench="roofline_phases",
                model=args.shape,
                simulated=True,
                **account(shape, steps, args.tail_batch),
            )
        )
    else:
        import tempfile
        from pathlib import Path

        from nanoserve.benchmarks import roofline_kernels
        from nanoserve.benchmarks.shapes import write_shape_dir
        from nanoserve.worker import LLM

        model = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-roofline-")))
        llm = LLM(
            str(model),
            load_format="dummy",
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_dtype=args.kv_cache_dtype,
            decode_fusions=args.decode_fusions,
        )
        try:
            if args.phases:
                out.append(
                    dict(
                        bench="roofline_phases",
                        model=args.shape,
                        kv_cache_dtype=args.kv_cache_dtype,
                        **measure_phases(llm, shape, work),
                    )
                )
            for b in (x for x in args.batches.split(",") if x):
                batch, mixed = int(b.rstrip("m")), b.endswith("m")
                profile = roofline_kernels.profile_decode(
                    llm, shape, batch, args.context, mixed=mixed
                )
                out.append(
                    dict(
                        bench="roofline_decode",
                        model=args.shape,
                        kv_cache_dtype=args.kv_cache_dtype,
                        **profile,
                    )
                )
            if args.prefill_tokens:
                profile = roofline_kernels.profile_prefill(llm, shape, args.prefill_tokens)
                out.append(
                    dict(
                        bench="roofline_prefill",
                        model=args.shape,
                        kv_cache_dtype=args.kv_cache_dtype,
                        **profile,
                    )
                )
        finally:
            llm.shutdown()
    for r in out:
        print(json.dumps(r) if args.json else json.dumps(r, indent=1), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
