"""Prompt logprobs in row chunks (ModelRunner.execute, PromptLogprobs): a tiny chunk gives the
entries of one LM-head call over every prompt row (ids, ranks and top ids exactly; logprobs to the
last float32 bits, which a GEMM's row blocking may change), and no LM-head call takes more rows
than a chunk (plus the sampled rows' own call); tensor-parallel ranks chunk alike."""

import pytest
import torch

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.logprobs import PROMPT_CHUNK_ROWS, prompt_chunk_bytes
from tests.unit.hf_reference import make_hf_model, prompts_of

CHUNK = 3
ULP = 2e-6  # a few float32 ulps at |logprob| ~ 6


def assert_same_entries(got: list | None, want: list | None, atol: float = ULP) -> None:
    """Entries [token_id, logprob, rank, top_ids, top_logprobs]: all but the floats exact."""
    assert (got is None) == (want is None)
    if got is None or want is None:
        return
    assert [(e[0], e[2], e[3]) for e in got] == [(e[0], e[2], e[3]) for e in want]
    floats = [[e[1], *e[4]] for e in got], [[e[1], *e[4]] for e in want]
    for a, b in zip(*floats):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=atol, rtol=0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompt_chunks")
    make_hf_model(path)
    return path


PROMPTS = prompts_of([41, 2, 17, 9], seed=11)
PARAMS = [
    SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2, prompt_logprobs=5),
    SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=0),
    SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),  # asks for nothing
    SamplingParams(temperature=0.9, seed=5, max_tokens=4, ignore_eos=True, prompt_logprobs=20),
]


def counted_llm(path, chunk_rows: int, **engine) -> tuple[LLM, list[int]]:
    """A CPU engine whose prompt chunks are chunk_rows, and the rows of each LM-head call."""
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, **engine)
    llm.model_runner.prompt_chunk_rows = chunk_rows
    sizes: list[int] = []
    model = llm.model_runner.model
    lm_head = model.compute_logits

    def counting(hidden: torch.Tensor) -> torch.Tensor:
        sizes.append(hidden.shape[0])
        return lm_head(hidden)

    model.compute_logits = counting
    return llm, sizes


def generate(path, chunk_rows: int, **engine):
    llm, sizes = counted_llm(path, chunk_rows, **engine)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return [(o.token_ids, o.logprobs, o.prompt_logprobs) for o in outs], sizes


@pytest.mark.parametrize(
    "engine",
    [
        {"decode_lookahead": True},  # whole prompts in one step
        {"decode_lookahead": True, "max_num_batched_tokens": 16},  # chunked prefill
        {"decode_lookahead": False, "max_num_batched_tokens": 10},
    ],
    ids=["one-step", "chunked-prefill-lookahead", "chunked-prefill"],
)
def test_tiny_chunks_give_exactly_the_unchunked_entries(model_path, engine):
    whole, whole_sizes = generate(model_path, 10_000, **engine)
    chunked, sizes = generate(model_path, CHUNK, **engine)
    for (ids, logprobs, prompt), (want_ids, want_logprobs, want_prompt) in zip(chunked, whole):
        assert ids == want_ids and logprobs == want_logprobs  # sampled rows: the same call
        assert_same_entries(prompt, want_prompt)
    for (_, _, prompt), sp, ids in zip(chunked, PARAMS, PROMPTS):
        if sp.prompt_logprobs is None:
            assert prompt is None
        else:
            assert [e[0] for e in prompt] == ids[1:]  # one entry per prompt token after the first
            assert all(len(e[3]) == sp.prompt_logprobs for e in prompt)
    # the sampled rows' call takes at most the 4 sequences, every prompt call at most CHUNK rows;
    # unchunked, one call took a whole step's prompt rows
    assert max(sizes) <= max(CHUNK, len(PROMPTS)) < max(whole_sizes)
    assert sum(sizes) == sum(whole_sizes)


def test_peak_rows_per_lm_head_call_never_pass_the_chunk(model_path):
    """One long prompt alone (one sampled row): every LM-head call holds at most CHUNK rows."""
    llm, sizes = counted_llm(model_path, CHUNK)
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)
    out = llm.generate(prompts_of([100], seed=2), sp, use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == 99
    assert max(sizes) == CHUNK and sum(sizes) == 99 + 2  # 33 prompt chunks, 2 sampled rows


def test_chunk_peak_is_a_stated_bound():
    # Qwen3's vocabulary in bf16: 256 rows x 151936 x (2 x 2 + 4 + 4 + 1) B, about half a GB
    assert PROMPT_CHUNK_ROWS == 256
    assert prompt_chunk_bytes(256, 151936, torch.bfloat16) == 256 * 151936 * 13
    assert prompt_chunk_bytes(PROMPT_CHUNK_ROWS, 151936, torch.bfloat16) < 0.52e9


def test_chunks_under_tensor_parallelism(model_path):
    """tp=2 on gloo: rank 0's chunk size travels in the step message, so the ranks' LM-head
    all-gathers pair up; the entries equal the single-rank ones."""
    single, _ = generate(model_path, 10_000)
    llm = LLM(
        model_path,
        device="cpu",
        tensor_parallel_size=2,
        kvcache_block_size=16,
        num_kvcache_blocks=64,
    )
    try:
        llm.model_runner.runner.prompt_chunk_rows = CHUNK
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()
    for out, (ids, _, prompt) in zip(outs, single):
        assert out.token_ids == ids
        assert_same_entries(out.prompt_logprobs, prompt, atol=1e-4)  # sharded GEMMs


def test_forked_completions_never_recompute_the_prompt_logprobs(model_path):
    """n = 3 under preemption: the parent computes the prompt's logprobs once; a preempted fork
    recomputes its KV only (no second set of prompt rows, no refusal of prefix hits)."""
    llm = LLM(model_path, device="cpu", kvcache_block_size=8, num_kvcache_blocks=14)
    sp = SamplingParams(
        n=3, temperature=1.0, seed=1, max_tokens=24, ignore_eos=True, prompt_logprobs=1
    )
    for prompt in prompts_of([30, 26], seed=4):
        llm.add_request(prompt, sp)
    handed: dict[int, int] = {}  # seq_id -> prompt entries handed out
    while not llm.is_finished():
        for out in llm.step():
            if out.prompt_logprobs:
                handed[out.seq.seq_id] = handed.get(out.seq.seq_id, 0) + len(out.prompt_logprobs)
    assert llm.scheduler.num_preemptions > 0
    assert sorted(handed.values()) == [25, 29]  # one set per request, from its parent
