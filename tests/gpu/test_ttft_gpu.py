"""Time to first token on CUDA (Qwen3-0.6B shapes, random weights): after the engine's start-up no
prompt length compiles a Triton kernel, so a length the engine has never seen (primes, 1, the
longest) reaches its first token as fast as a length it has; and the prefill graphs give
the eager prefill's logits bit for bit."""

import random
import statistics
import time

import pytest
import torch

from tests.gpu.test_engine_gpu import free, hf_model, make_llm, teacher_forced_logits  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MAX_MODEL_LEN = 4096
# 600 is the length seen first; the rest are new to the engine
UNSEEN = [
    1,
    2,
    3,
    7,
    13,
    31,
    37,
    61,
    127,
    251,
    509,
    601,
    777,
    1021,
    1499,
    2039,
    4000,
    MAX_MODEL_LEN - 1,
]


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(151643) for _ in range(n)]


def ttft_ms(llm, prompt: list[int]) -> float:
    """One request alone, max_tokens=1: its prefill step, the sample and the engine's bookkeeping."""
    from nanoserve.worker import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], sp, use_tqdm=False)
    return (time.perf_counter() - start) * 1e3


def test_first_requests_compile_nothing(hf_model, capsys):
    """From the engine's start, the first requests of each kind compile no Triton kernel: greedy
    and sampled steps (the one-pass sampler's two specialisations), seeded rows in odd and even
    counts, top-k/top-p, logprobs, decode steps with lookahead (the graphs' input fill with
    sampled ids), and a burst of prompts whose step is past the largest prefill bucket (eager, as
    the served default's 16,384-token steps are). d537462 compiled three specialisations on the
    first requests it served; 73d84fc's graphs two in the eager burst (H100, bench serving)."""
    import triton

    from nanoserve.worker import SamplingParams

    path, _ = hf_model
    # (the served default: steps up to 16,384 tokens, graphs up to 8,192)
    llm = make_llm(
        path, max_model_len=MAX_MODEL_LEN, num_kvcache_blocks=64, max_num_batched_tokens=16384
    )
    assert llm.model_runner.prefill_buckets[-1] < 3 * 3000
    compiled: list[str] = []
    triton.knobs.runtime.jit_cache_hook = lambda *a, **kw: compiled.append(kw.get("repr", "?"))
    rng = random.Random(2)
    kinds = {
        "greedy": [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 3,
        "sampled": [SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)] * 5,
        "greedy and sampled": [
            SamplingParams(temperature=t, max_tokens=8, ignore_eos=True) for t in (0, 0.7, 0)
        ],
        "seeded x3": [
            SamplingParams(temperature=0.8, seed=s, max_tokens=8, ignore_eos=True) for s in range(3)
        ],
        "seeded x2 of 3": [
            SamplingParams(temperature=0.8, seed=s, max_tokens=8, ignore_eos=True)
            for s in (5, 6, None)
        ],
        "top-k/top-p, logprobs": [
            SamplingParams(
                temperature=0.6, top_k=20, top_p=0.95, logprobs=2, max_tokens=8, ignore_eos=True
            )
        ]
        * 2,
    }
    burst = "3 x 3,000 tokens, one eager step"
    kinds[burst] = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 3
    seen = {}
    try:
        for kind, params in kinds.items():
            n = 3000 if kind == burst else 37
            outs = llm.generate([random_prompt(rng, n) for _ in params], params, use_tqdm=False)
            assert all(len(o.token_ids) == 8 for o in outs)
            seen[kind] = len(compiled)
    finally:
        triton.knobs.runtime.jit_cache_hook = None
    free(llm)
    with capsys.disabled():
        print(f"\n[gpu] specialisations while serving, cumulative by request kind: {seen}")
        if compiled:
            print("  compiled while serving:\n   " + "\n   ".join(c[:400] for c in compiled))
    assert not compiled


def test_unseen_prompt_lengths_compile_nothing_and_are_as_fast(hf_model, capsys):
    import triton

    path, _ = hf_model
    started = time.perf_counter()
    llm = make_llm(
        path, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=8192, num_kvcache_blocks=64
    )
    start_s = time.perf_counter() - started
    rng = random.Random(0)
    compiled: list[str] = []

    def on_compile(*args, **kwargs):  # called before each new specialisation, cached on disk or not
        compiled.append(kwargs.get("repr", "?"))
        # go on compiling

    triton.knobs.runtime.jit_cache_hook = on_compile
    ttft_ms(llm, random_prompt(rng, 600))  # a first request: lazy host-side state (not timed)

    def segments() -> int:  # cudaMalloc calls of the caching allocator so far
        return torch.cuda.memory_stats().get("segment.all.allocated", 0)

    try:
        # distinct random prompts: no prefix-cache hit makes a repeat cheaper. cudaMalloc calls are
        # counted over the whole first pass, not around each request: memory_stats() walks the
        # allocator's state, host work beside a ~4 ms measurement.
        before = segments()
        # Each first request has a twin: the same length again, right after a request of the
        # length that preceded the first (a short prompt after a long one pays ~0.5 ms whether its
        # length is new or not: H200, 6f24aef). The twin is ~2 requests later, so a slower phase of
        # the whole process cancels out: H100, 1ebe780, after eight engines in the same pytest
        # process, every length's first request of one pass ran 0.3-0.5 ms over the later passes
        # (1 of 4 runs; median excess -0.02 to 0.01 ms in the other three), and the old first-pass-against-later-passes check
        # failed on it, as it did on the H200 (0.6-0.8 ms at lengths 777 and 1021).
        first, twin = {}, {}
        predecessor = 600
        for n in UNSEEN:
            first[n] = ttft_ms(llm, random_prompt(rng, n))
            ttft_ms(llm, random_prompt(rng, predecessor))
            twin[n] = ttft_ms(llm, random_prompt(rng, n))
            predecessor = n
        mallocs = segments() - before
        # then a second pass in the same order, and 3 repeats of each length
        later = {n: [ttft_ms(llm, random_prompt(rng, n))] for n in UNSEEN}
        for n in UNSEEN:
            later[n] += [ttft_ms(llm, random_prompt(rng, n)) for _ in range(3)]
        seen = {n: statistics.median(r) for n, r in later.items()}
    finally:
        triton.knobs.runtime.jit_cache_hook = None
    free(llm)
    with capsys.disabled():
        print(
            f"\n[gpu] engine start (weights, cache, graphs, kernels) {start_s:.1f} s; TTFT ms, "
            f"first of a length / its twin / median of 4 more ({mallocs} cudaMalloc calls in the "
            "first pass):"
        )
        for n in UNSEEN:
            print(f"  {n:5d} tokens: {first[n]:7.2f} / {twin[n]:7.2f} / {seen[n]:7.2f}")
        if compiled:
            print("  compiled while serving:\n   " + "\n   ".join(compiled))
    assert not compiled
    # One first request is one sample: against the slowest of the later ones of its length (its
    # twin after the same predecessor), within 10% and half a millisecond of host jitter at the
    # shortest prompts. A cost every first request pays shows in the median excess over the
    # twins instead (H200, e256838: 0.02 ms against the later passes; the 0.3-0.8 ms a length of
    # 999a1b8 would fail).
    slowest = {n: max([twin[n], *later[n]]) for n in UNSEEN}
    slow = {
        n: (first[n], slowest[n])
        for n in UNSEEN
        if first[n] > max(1.10 * slowest[n], slowest[n] + 0.5)
    }
    assert not slow
    assert statistics.median(first[n] - twin[n] for n in UNSEEN) < 0.25


def test_prefill_graphs_give_eager_logits(hf_model, capsys):
    """The graphs replay the eager kernels over the same padded shapes: identical logits for every
    prompt position, at lengths below, on and between the buckets."""
    path, _ = hf_model
    lengths = [1, 16, 17, 37, 600, 1500, 2048, 3000]
    rng = random.Random(1)
    prompts = [random_prompt(rng, n) for n in lengths]
    out = {}
    for eager in (False, True):
        llm = make_llm(path, max_model_len=4096, enforce_eager=eager)
        assert (llm.model_runner.prefill_graphs is None) == eager
        out[eager] = [teacher_forced_logits(llm, p) for p in prompts]
        free(llm)
    differ = [n for n, a, b in zip(lengths, out[False], out[True]) if not torch.equal(a, b)]
    with capsys.disabled():
        print(f"\n[gpu] prefill graphs vs eager: logits differ at lengths {differ}")
    assert not differ
