"""Per-step token-bitmask fill time of the two grammar engines structured output could use
(xgrammar, llguidance) on Qwen3's 151,936-token vocabulary: figures, never pass/fail. Each grammar
is walked by random allowed tokens (restarted when it terminates); the time of one mask fill per
step is reported (median, p90, max) with the compile time. CPU only: the engines run on the host.

    nanoserve make-tiny-model /tmp/tiny   # the real Qwen3 tokenizer.json and vocabulary size
    python -m nanoserve.benchmarks.structured_mask --model /tmp/tiny [--steps 300]
        [--apply-rows 256 --device cuda]   # also: the sampler's bitmask apply on the device
"""

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,6}@(foo|bar)\.com"
GRAMMARS = {"json_schema": json.dumps(SCHEMA), "json_object": "", "regex": REGEX}

# a walker: (grammar kind, text, vocab) -> (compile seconds, step() filling a mask and advancing
# by one random allowed token, returning the fill seconds)
Walker = Callable[[str, str], tuple[float, Callable[[], float]]]


def vocab_of(tokenizer_json: str, vocab_size: int) -> list[str]:
    tj = json.loads(tokenizer_json)
    vocab = [""] * vocab_size
    for token, i in tj["model"]["vocab"].items():
        vocab[i] = token
    for added in tj["added_tokens"]:
        vocab[added["id"]] = added["content"]
    return vocab


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def xgrammar_walker(tokenizer_json: str, vocab_size: int, eos: list[int], rng: random.Random):
    import xgrammar as xgr

    info = xgr.TokenizerInfo(
        vocab_of(tokenizer_json, vocab_size),
        vocab_type=xgr.VocabType.BYTE_LEVEL,
        vocab_size=vocab_size,
        stop_token_ids=eos,
    )
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def make(kind: str, text: str) -> tuple[float, Callable[[], float]]:
        t0 = time.perf_counter()
        if kind == "json_schema":
            compiled = compiler.compile_json_schema(text, any_whitespace=False)
        elif kind == "regex":
            compiled = compiler.compile_regex(text)
        else:
            compiled = compiler.compile_builtin_json_grammar()
        compile_s = time.perf_counter() - t0
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, vocab_size)

        def step() -> float:
            if matcher.is_terminated():
                matcher.reset()
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(mask, 0)
            dt = time.perf_counter() - t
            assert matcher.accept_token(int(rng.choice(allowed_ids(mask.numpy()[0], vocab_size))))
            return dt

        return compile_s, step

    return make


def llguidance_walker(tokenizer_json: str, vocab_size: int, eos: list[int], rng: random.Random):
    import llguidance
    import llguidance.numpy as llnp

    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)

    def make(kind: str, text: str) -> tuple[float, Callable[[], float]]:
        t0 = time.perf_counter()
        if kind == "json_schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                text, defaults={"whitespace_flexible": False}
            )
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(text)
        else:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                '{"type": "object"}', defaults={"whitespace_flexible": False}
            )
        matcher = llguidance.LLMatcher(tok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        compile_s = time.perf_counter() - t0
        mask = llnp.allocate_token_bitmask(1, vocab_size)

        def step() -> float:
            if matcher.is_stopped():
                matcher.reset()
            t = time.perf_counter()
            llnp.fill_next_token_bitmask(matcher, mask, 0)
            dt = time.perf_counter() - t
            assert matcher.consume_token(int(rng.choice(allowed_ids(mask[0], vocab_size))))
            return dt

        return compile_s, step

    return make


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model dir with tokenizer.json, config.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--engines", default="xgrammar,llguidance")
    ap.add_argument("--apply-rows", type=int, default=0, help="time apply_token_bitmask too")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    model_dir = Path(args.model)
    tokenizer_json = (model_dir / "tokenizer.json").read_text()
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = config["vocab_size"]
    eos = [151645, 151643]
    print(f"vocab {vocab_size}, {args.steps} steps a grammar, one mask row, one thread")
    print(
        f"{'engine':<11} {'grammar':<12} {'compile ms':>10} {'p50 us':>8} {'p90 us':>8} {'max us':>8}"
    )
    makers = {"xgrammar": xgrammar_walker, "llguidance": llguidance_walker}
    for engine in args.engines.split(","):
        t0 = time.perf_counter()
        make = makers[engine](tokenizer_json, vocab_size, eos, random.Random(0))
        print(f"{engine:<11} {'(tokenizer)':<12} {1e3 * (time.perf_counter() - t0):10.0f}")
        for kind, text in GRAMMARS.items():
            compile_s, step = make(kind, text)
            times = sorted(step() for _ in range(args.steps))
            p50, p90 = statistics.median(times), times[int(0.9 * len(times))]
            print(
                f"{engine:<11} {kind:<12} {1e3 * compile_s:10.1f} {1e6 * p50:8.0f} "
                f"{1e6 * p90:8.0f} {1e6 * times[-1]:8.0f}"
            )

    if args.apply_rows:
        print(apply_time(args.apply_rows, vocab_size, args.device))


def apply_time(rows: int, vocab_size: int, device: str) -> str:
    """The sampler's mask step (worker.runner.sampler.apply_token_bitmask) on `rows` rows of logits."""
    import torch

    from nanoserve.worker.runner.sampler import apply_token_bitmask

    dev = torch.device(device)
    logits = torch.randn(rows, vocab_size, device=dev)
    words = (vocab_size + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, device=dev)
    for _ in range(3):
        apply_token_bitmask(logits, None, bitmask)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0, n = time.perf_counter(), 20
    for _ in range(n):
        apply_token_bitmask(logits, None, bitmask)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return f"apply_token_bitmask {rows} rows on {device}: {1e6 * (time.perf_counter() - t0) / n:.0f} us"


if __name__ == "__main__":
    main()
