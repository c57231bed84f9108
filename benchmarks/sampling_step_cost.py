"""Host cost of one decode step's sampling inputs (SamplingInputs.prepare) when every sequence uses
penalties and/or a seed: figures, never pass/fail. The review's case is 256 sequences of 1,500
tokens over Qwen3's 151,936-token vocabulary.

    python -m nanoserve.benchmarks.sampling_step_cost [--seqs 256] [--prompt 1000] [--output 500]
        [--sample] [--noise]

--noise also times the seeded rows' exponential noise: one draw for all of them
(worker.runner.seeded_noise) against the one generator launch per row it replaced.
--token-rules times logit_bias (--bias-entries per sequence) and allowed_token_ids (--allowed-ids
per sequence) instead, against plain rows, with --rule-rows of the sequences using them.
--filters times Qwen3's default sampling (temperature 0.6, top_k 20, top_p 0.95: top-k from
torch.topk) against the same rows through the sort of the vocabulary, and top_p alone (a sort).
"""

import argparse
import random
import time

import torch

from nanoserve.sampling import SamplingParams
from nanoserve.worker.runner.sampler import sample
from nanoserve.worker.runner.sampling_inputs import SamplingInputs
from nanoserve.worker.runner.seeded_noise import fill_seeded_exponential
from nanoserve.worker.sequence import Sequence


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nanoserve bench sampling-step-cost", description=__doc__)
    ap.add_argument(
        "--seqs", type=int, default=256, help="sequences in the decode batch (default: 256)"
    )
    ap.add_argument(
        "--prompt", type=int, default=1000, help="prompt tokens of each sequence (default: 1000)"
    )
    ap.add_argument(
        "--output",
        type=int,
        default=500,
        help="tokens each sequence has generated before the timed steps (default: 500)",
    )
    ap.add_argument(
        "--vocab", type=int, default=151936, help="vocabulary size (default: Qwen3's 151936)"
    )
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed (default: 20)")
    ap.add_argument("--sample", action="store_true", help="also time sample() on random logits")
    ap.add_argument(
        "--noise",
        action="store_true",
        help="also time the seeded rows' noise: one counter-based draw vs one generator per row",
    )
    ap.add_argument(
        "--token-rules",
        action="store_true",
        help="time logit_bias / allowed_token_ids rows instead of penalties and seeds",
    )
    ap.add_argument(
        "--filters",
        action="store_true",
        help="time top-k / top-p rows instead (with --sample: topk against the vocabulary sort)",
    )
    ap.add_argument("--bias-entries", type=int, default=1024, help="logit_bias entries per row")
    ap.add_argument("--allowed-ids", type=int, default=64, help="allowed_token_ids per row")
    ap.add_argument(
        "--rule-rows", type=int, default=0, help="rows using them (default 0: every row)"
    )
    ap.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    rng = random.Random(0)
    cases = (
        token_rule_cases(args, rng)
        if args.token_rules
        else filter_cases()
        if args.filters
        else {
            "penalties": SamplingParams(
                temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.2, max_tokens=None
            ),
            "seeded": SamplingParams(temperature=1.0, seed=7, max_tokens=None),
        }
    )
    plain = SamplingParams(temperature=1.0, max_tokens=None)
    rule_rows = args.rule_rows or args.seqs
    for name, sp in cases.items():
        inputs = SamplingInputs(device, args.vocab)
        seqs = []
        for i in range(args.seqs):
            row_sp = sp if not args.token_rules or i < rule_rows else plain
            seq = Sequence([rng.randrange(args.vocab) for _ in range(args.prompt)], row_sp)
            seq.token_ids += [rng.randrange(args.vocab) for _ in range(args.output)]
            seqs.append(seq)
        logits = torch.randn(args.seqs, args.vocab, device=device) if args.sample else None
        prepare = sample_time = 0.0
        for step in range(args.steps + 1):
            for seq in seqs:
                seq.append_token(rng.randrange(args.vocab))
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            t = inputs.prepare(seqs)
            if name.endswith("(sort)"):
                t.max_top_k = None  # filter_logits sorts the vocabulary (the path before topk)
            t1 = time.perf_counter()
            if logits is not None:  # --sample
                sample(logits, t).tolist()
            t2 = time.perf_counter()
            if step:  # the first step builds per-sequence state
                prepare, sample_time = prepare + t1 - t0, sample_time + t2 - t1
        print(
            f"{name:>16}: {args.seqs} seqs x {args.prompt + args.output} tokens, vocab "
            f"{args.vocab} on {device.type}: prepare {prepare / args.steps * 1e3:.2f} ms/step, "
            f"sample {sample_time / args.steps * 1e3:.2f} ms/step"
        )
    if args.noise:
        time_noise(args.seqs, args.vocab, args.steps, device)


def filter_cases() -> dict[str, SamplingParams]:
    """Qwen3's generation_config sampling, by topk and by the sort, and top_p alone."""
    qwen3 = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, max_tokens=None)
    return {
        "plain": SamplingParams(temperature=0.6, max_tokens=None),
        "k20 p0.95": qwen3,
        "k20 p0.95 (sort)": qwen3,
        "p0.95": SamplingParams(temperature=0.6, top_p=0.95, max_tokens=None),
    }


def token_rule_cases(args: argparse.Namespace, rng: random.Random) -> dict[str, SamplingParams]:
    """Plain rows, then rows with a logit_bias, then rows with allowed_token_ids."""
    bias = {t: rng.uniform(-100, 100) for t in rng.sample(range(args.vocab), args.bias_entries)}
    allowed = rng.sample(range(args.vocab), args.allowed_ids)
    return {
        "plain": SamplingParams(temperature=1.0, max_tokens=None),
        "logit_bias": SamplingParams(temperature=1.0, max_tokens=None, logit_bias=bias),
        "allowed": SamplingParams(temperature=1.0, max_tokens=None, allowed_token_ids=allowed),
    }


def time_noise(num_rows: int, vocab: int, steps: int, device: torch.device) -> None:
    """ms per step to fill (num_rows, vocab) noise for seeded rows, both ways."""
    noise = torch.empty(num_rows, vocab, device=device)
    rows = torch.arange(num_rows, device=device)
    seeds = torch.arange(num_rows, device=device) * 7919
    generators = [torch.Generator(device).manual_seed(i) for i in range(num_rows)]

    def per_row(step: int) -> None:  # the replaced path: a launch per seeded row
        for row, gen in enumerate(generators):
            noise[row].exponential_(generator=gen)

    def counter_based(step: int) -> None:
        fill_seeded_exponential(noise, rows, seeds, torch.full_like(rows, step))

    for name, fill in [("per-row generators", per_row), ("counter-based", counter_based)]:
        fill(0)  # warm up (and compile the kernel on CUDA)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            fill(step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / steps * 1e3
        print(
            f"    noise: {num_rows} seeded rows x vocab {vocab} on {device.type}, {name}: {ms:.2f} ms/step"
        )


if __name__ == "__main__":
    main()
