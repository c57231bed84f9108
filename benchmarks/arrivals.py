"""Poisson arrivals straight into LLMEngine, no services (`nanoserve bench arrivals`): each step's
kind, size and time, every stream's inter-token gaps, and the kinds of step the slowest gaps end in.
What the engine's scheduling alone gives the serving benchmark's Poisson run (issue 29's ITL p99/p50).

Step kinds: `ahead` a decode step whose logits a step forwarded ahead had computed (decode
lookahead), `decode` one forwarded afresh, `mixed` decodes and prompt tokens, `mixed+ahead` a mixed
step forwarded ahead (--lookahead-prompts on), `+wasted` a step that dropped the one forwarded
ahead for it (an arrival came while it ran).
"""

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from nanoserve.benchmarks import workload
from nanoserve.benchmarks.shapes import SHAPES, write_shape_dir
from nanoserve.benchmarks.stalls import StallWatch
from nanoserve.benchmarks.stats import percentile, summarize


def replay(llm, requests: list[workload.Request], temperature: float) -> dict:
    """Feeds `requests` at their arrival times between steps (as the engine core drains its inbox)
    and records every step and every token's time."""
    from nanoserve.worker import SamplingParams

    runner = llm.model_runner
    pending = sorted(requests, key=lambda r: r.arrival_s)
    arrived: dict[str, float] = {}
    token_times: dict[str, list[float]] = {}
    ended_by: dict[float, str] = {}  # a step's end time -> its kind
    # (kind, seconds, seqs with output, prompt tokens)
    steps: list[tuple[str, float, int, int]] = []
    i, t0 = 0, time.perf_counter()
    while i < len(pending) or not llm.is_finished():
        now = time.perf_counter() - t0
        if llm.is_finished() and pending[i].arrival_s > now:
            time.sleep(pending[i].arrival_s - now)
            now = pending[i].arrival_s
        while i < len(pending) and pending[i].arrival_s <= now:
            r = pending[i]
            sp = SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=r.max_tokens)
            llm.add_request(r.prompt_token_ids, sp, r.request_id)
            arrived[r.request_id] = t0 + r.arrival_s
            i += 1
        had_ahead, foreseen_before = runner.foreseen is not None, runner.num_foreseen_steps
        prompt_before = llm.num_prompt_tokens_done
        start = time.perf_counter()
        outputs = llm.step()
        end = time.perf_counter()
        prompt_tokens = llm.num_prompt_tokens_done - prompt_before
        if runner.num_foreseen_steps > foreseen_before:
            kind = "mixed+ahead" if prompt_tokens else "ahead"
        else:
            kind = ("mixed" if prompt_tokens else "decode") + ("+wasted" if had_ahead else "")
        steps.append((kind, end - start, len(outputs), prompt_tokens))
        ended_by[end] = kind
        for o in outputs:
            if o.new_token_ids:
                token_times.setdefault(o.seq.request_id, []).append(end)
    wall = time.perf_counter() - t0
    return _account(requests, arrived, token_times, ended_by, steps, wall)


def _account(requests, arrived, token_times, ended_by, steps, wall: float) -> dict:
    gaps: list[tuple[float, str]] = []  # (seconds, kind of the step that ended it)
    for times in token_times.values():
        gaps += [(b - a, ended_by[b]) for a, b in zip(times, times[1:])]
    gap_s = sorted(g for g, _ in gaps)
    p50, p99 = percentile(gap_s, 50), percentile(gap_s, 99)
    slow = Counter(kind for g, kind in gaps if g >= p99)
    by_kind: dict[str, list[tuple[float, int, int]]] = {}
    for kind, *rest in steps:
        by_kind.setdefault(kind, []).append(tuple(rest))
    tokens = sum(r.max_tokens for r in requests)
    return dict(
        output_tok_s=round(tokens / wall),
        itl_ms=summarize(gap_s, 1e3),
        itl_p99_over_p50=round(p99 / p50, 2),
        ttft_ms=summarize((token_times[rid][0] - t for rid, t in arrived.items()), 1e3),
        slowest_1pct_of_gaps_end_in={k: round(v / sum(slow.values()), 3) for k, v in slow.items()},
        steps={k: _steps(v) for k, v in sorted(by_kind.items())},
        # the 3 slowest steps: a one-off (a compile, a GC pause) shows as one far above the rest
        slowest_steps=[
            dict(index=i, kind=k, ms=round(s * 1e3, 2), seqs=b, prompt_tokens=t)
            for i, (k, s, b, t) in sorted(enumerate(steps), key=lambda x: -x[1][1])[:3]
        ],
    )


def _steps(steps: list[tuple[float, int, int]]) -> dict:
    """One kind of step: its ms, and the mean sequences and prompt tokens it carried."""
    n = len(steps)
    return dict(
        ms=summarize((s for s, _, _ in steps), 1e3),
        seqs=round(sum(b for _, b, _ in steps) / n, 1),
        prompt_tokens=round(sum(t for _, _, t in steps) / n),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench arrivals", description=__doc__)
    p.add_argument("--model", default="", help="model directory (default: random weights)")
    p.add_argument(
        "--shape", default="qwen3-0.6b", choices=sorted(SHAPES), help="random weights' shape"
    )
    p.add_argument("--rate", type=float, default=38.0, help="requests per second (Poisson)")
    p.add_argument("--num-prompts", type=int, default=608, help="requests of each run")
    p.add_argument("--runs", type=int, default=3, help="fresh prompt ids and arrivals each")
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt and output, tokens")
    p.add_argument("--max-len", type=int, default=1024, help="longest prompt and output, tokens")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    p.add_argument(
        "--max-prefill-tokens-while-decoding",
        type=int,
        nargs="+",
        default=[0],
        help="one variant per value, each run in turn (0: --max-num-batched-tokens)",
    )
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=16384, help="max tokens in one step"
    )
    p.add_argument(
        "--decode-lookahead",
        default="auto",
        choices=["auto", "on", "off"],
        help="forward decode step N+1 before N's ids reach the host (auto: on CUDA)",
    )
    p.add_argument(
        "--lookahead-prompts",
        nargs="+",
        default=["off"],
        choices=["on", "off"],
        help="one variant per value, each run in turn: forward mixed steps and the step after a "
        "prefill ahead too (EngineConfig.lookahead_prompts)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    args = p.parse_args(argv)
    if not 1 <= args.min_len <= args.max_len:
        p.error("--min-len and --max-len: must be in [1, --max-len] and [--min-len, ...]")
    if args.rate <= 0 or args.num_prompts < 1 or args.runs < 1:
        p.error("--rate must be > 0, --num-prompts and --runs at least 1")
    from nanoserve.worker import LLM

    kw = dict(
        max_model_len=4096,
        max_num_seqs=512,
        max_num_batched_tokens=args.max_num_batched_tokens,
        decode_lookahead={"auto": None, "on": True, "off": False}[args.decode_lookahead],
    )
    if args.model:
        llm = LLM(args.model, **kw)
    else:
        model = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-bench-")))
        llm = LLM(model, load_format="dummy", **kw)
    vocab = llm.model_config.vocab_size
    warm = workload.build("warm", workload.lengths(16, args.min_len, args.max_len, 8, 8, 1), vocab)
    replay(llm, warm, args.temperature)
    variants = [
        (c, p) for c in args.max_prefill_tokens_while_decoding for p in args.lookahead_prompts
    ]
    for run in range(args.runs):
        for cap, prompts in variants:
            llm.scheduler.max_prefill_tokens_while_decoding = cap or args.max_num_batched_tokens
            llm.lookahead_prompts = prompts == "on"  # read by every step
            shape = workload.lengths(
                args.num_prompts, args.min_len, args.max_len, args.min_len, args.max_len, seed=run
            )
            reqs = workload.build(f"r{run}c{cap}{prompts}", shape, vocab, args.rate, seed=run)
            with StallWatch() as stalls:  # what, besides the steps' work, could stall a step
                res = replay(llm, reqs, args.temperature)
            line = dict(bench="arrivals", run=run, cap=cap, lookahead_prompts=prompts, **res)
            line["stalls"] = stalls.summary()
            print(json.dumps(dict(line, rate=args.rate)), flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
