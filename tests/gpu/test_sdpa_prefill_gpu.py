"""EngineConfig.prefill_sdpa_min_tokens on CUDA (Qwen3-0.6B shapes, random weights): a prompt of at
least that many tokens, nothing cached, attends with torch's SDPA (cuDNN on Hopper) instead of the
Triton prefill kernel. Its logits agree with the Triton path's (top-1 at every prompt position, the
issue's bf16 criterion ≥ 0.99), nothing allocates on the first such prompts (start-up captured an
SDPA graph of each bucket), and it prints both paths' TTFT at 4,000 tokens, the first request's and the median of
5 more (figures, not checks: a first request far over the median is a plan built while serving)."""

import random
import statistics

import pytest
import torch

from tests.gpu.test_engine_gpu import free, hf_model, make_llm, teacher_forced_logits  # noqa: F401
from tests.gpu.test_ttft_gpu import random_prompt, ttft_ms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MIN_TOKENS = 1024
LENGTHS = [1024, 1500, 3000, 4000]


def test_sdpa_prefill_agrees_with_the_triton_kernel_and_builds_its_plans_at_start(hf_model, capsys):
    path, _ = hf_model
    rng = random.Random(2)
    prompts = [random_prompt(rng, n) for n in LENGTHS]
    logits, ttft, mallocs, start = {}, {}, {}, {}
    for low in (0, MIN_TOKENS):
        llm = make_llm(path, max_model_len=4096, prefill_sdpa_min_tokens=low)
        runner, buckets = llm.model_runner, llm.model_runner.prefill_buckets
        high = next(b for b in buckets if b >= 4096)  # the bucket of max_model_len
        assert runner.sdpa_lengths == ((low, high) if low else (0, 0))
        graphs = runner.prefill_graphs  # an SDPA graph of each bucket from the minimum to high
        assert graphs is not None
        assert graphs.can_run(high, sdpa=True) == bool(low)
        assert not any(graphs.can_run(b, sdpa=True) for b in buckets if b > high)
        start[low] = (runner.graph_memory_bytes / 2**20, runner.start_clock.summary())
        # the first request of each length, as a server meets them, allocates nothing; the
        # teacher-forced pass below allocates by design (its logits of every position, ~1 GiB at
        # 4,000 tokens), and the count included it until 2026-12-06 (1 cudaMalloc, twice)
        before = torch.cuda.memory_stats().get("segment.all.allocated", 0)
        firsts = [ttft_ms(llm, random_prompt(rng, n)) for n in LENGTHS]
        times = [ttft_ms(llm, random_prompt(rng, 4000)) for _ in range(5)]
        mallocs[low] = torch.cuda.memory_stats().get("segment.all.allocated", 0) - before
        ttft[low] = (firsts[-1], statistics.median(times))
        logits[low] = [teacher_forced_logits(llm, p) for p in prompts]
        free(llm)
    agreement = [
        (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        for a, b in zip(logits[0], logits[MIN_TOKENS])
    ]
    with capsys.disabled():
        print(
            f"\n[gpu] SDPA prefill from {MIN_TOKENS} tokens: top-1 agreement with the Triton kernel "
            f"by length {dict(zip(LENGTHS, agreement))}; 4,000-token TTFT first / median ms: "
            f"Triton {ttft[0][0]:.2f} / {ttft[0][1]:.2f}, SDPA {ttft[MIN_TOKENS][0]:.2f} / "
            f"{ttft[MIN_TOKENS][1]:.2f}; cudaMalloc calls in the first requests (Triton, SDPA) "
            f"{mallocs[0]}, {mallocs[MIN_TOKENS]}; CUDA graphs MiB and "
            f"start-up: Triton {start[0]}, SDPA {start[MIN_TOKENS]}"
        )
    assert min(agreement) >= 0.99
    assert mallocs == {0: 0, MIN_TOKENS: 0}


def test_cudnn_runs_the_prompt_layout(capsys):
    """The path is only worth its flag where torch picks cuDNN for it: with q, k, v as the qkv
    projection's column slices, or else after the copy sdpa_prefill makes (cudnn_takes)."""
    from nanoserve.worker.layers.attention import cudnn_takes

    n, hq, hkv, d = 4096, 16, 8, 128
    qkv = torch.randn(n, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)
    views = cudnn_takes(*(x.unsqueeze(0).transpose(1, 2) for x in (q, k, v)))
    dense = cudnn_takes(*(x.contiguous().unsqueeze(0).transpose(1, 2) for x in (q, k, v)))
    with capsys.disabled():
        print(
            f"\n[gpu] cuDNN SDPA takes the qkv slices as they are: {views}; dense copies: {dense}"
        )
    assert views or dense
