"""Prefix-cache reruns over 16-token blocks (issue 12): after a busy run (preemption, chunked prefill,
mixed decode + prefill steps, arrivals while others decode, decode lookahead, steps padded to the
prefill buckets as on CUDA) every prompt's rerun reads cached blocks whose KV is right: in float32
its logits equal a full prefill's and every generated token is the argmax of full-prefill logits.
Also on the Triton path of CUDA (its kernels in the interpreter, the prefill graphs' forward run
eagerly), CUDA graphs aside."""

import random

import pytest
import torch

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.prefill_graph import PrefillGraphRunner, prefill_buckets
from tests.engine_logits import prefix_hit_logits, teacher_forced_logits
from tests.unit.hf_reference import make_hf_model
from tests.unit.interpreted_kernels import kernels  # noqa: F401 (interpreter + numpy shim)

BLOCK = 16
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix-hits")
    make_hf_model(path, max_position_embeddings=512)
    return path


def make_llm(path, triton: bool = False, **kw) -> LLM:
    args = dict(device="cpu", kvcache_block_size=BLOCK, decode_lookahead=True)
    llm = LLM(path, **{**args, **kw})
    # pad prefill steps to the buckets as the Triton backend does on CUDA (padded rows: slot -1)
    runner = llm.model_runner
    runner.prefill_buckets = prefill_buckets(llm.config.max_num_batched_tokens)
    if (
        triton
    ):  # CUDA's path: k/v stored by the q/k-norm + rotary kernel, the prefill graphs' forward
        for layer in runner.attention_layers:
            layer.backend = "triton"
        runner.prefill_graphs = PrefillGraphRunner(
            runner.model,
            runner.prefill_buckets,
            llm.config.max_num_seqs,
            runner.max_num_blocks_per_seq,
            runner.device,
            capture=False,
        )
    return llm


def prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_arriving(llm: LLM, ps: list[list[int]], every: int) -> list[list[int]]:
    """Greedy tokens of ps, one prompt added every `every` steps (they arrive while others decode)."""
    seqs, pending, steps = [], list(ps), 0
    while pending or not llm.is_finished():
        if pending and steps % every == 0:
            seqs.append(llm.add_request(pending.pop(0), GREEDY))
        llm.step()
        steps += 1
    return [seq.completion_token_ids for seq in seqs]


def assert_greedy_of_full_prefill(llm: LLM, prompt: list[int], out: list[int]) -> None:
    """Each token of out is the argmax of the full-prefill logits before it (or tied within 1e-4)."""
    logits = teacher_forced_logits(llm, prompt + out[:-1])[len(prompt) - 1 :]
    chosen = logits.gather(1, torch.tensor(out)[:, None])[:, 0]
    gap = logits.max(1).values - chosen
    assert gap.max().item() <= 1e-4, (len(prompt), gap.argmax().item(), gap.max().item())


def test_teacher_forced_logits_ignore_the_prefix_cache(model_dir):
    """The helper the GPU tests judge divergences by: after a run cached the prompt's blocks it still
    gives every position of a full prefill (it used to take the hits and return the padded step's
    rows, whose last is padding)."""
    llm = make_llm(model_dir, num_kvcache_blocks=64)
    prompt = prompts(1, 100, 100, seed=0)[0]
    before = teacher_forced_logits(llm, prompt)
    llm.generate([prompt], GREEDY, use_tqdm=False)
    after = teacher_forced_logits(llm, prompt)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    hits, last = prefix_hit_logits(llm, prompt)
    assert hits == 96
    torch.testing.assert_close(last, before[-1], rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "kw, every",
    [
        (dict(num_kvcache_blocks=48, max_num_batched_tokens=64, max_num_seqs=16), 3),
        (dict(num_kvcache_blocks=48, max_num_batched_tokens=2048, max_num_seqs=64), 1),
    ],
    ids=["chunked-mixed", "whole-prompts"],
)
def test_reruns_after_a_busy_run_read_the_right_kv(model_dir, kw, every):
    check_reruns(model_dir, make_llm(model_dir, **kw), prompts(24, 10, 150, seed=2), every, 8)


@pytest.mark.slow
def test_reruns_on_the_triton_path(model_dir):
    llm = make_llm(model_dir, True, num_kvcache_blocks=16, max_num_batched_tokens=64)
    check_reruns(model_dir, llm, prompts(8, 10, 100, seed=3), 1, 4)


def check_reruns(model_dir, llm: LLM, ps: list[list[int]], every: int, num_reruns: int) -> None:
    out = run_arriving(llm, ps, every)
    assert llm.scheduler.num_preemptions > 0  # a few sequences fill the cache
    assert llm.model_runner.num_foreseen_steps > 0
    rerun = [i for i in reversed(range(len(ps))) if len(ps[i]) > BLOCK][:num_reruns]
    hits_before = llm.block_manager.num_hit_tokens
    again = run_arriving(llm, [ps[i] for i in rerun], every=2)
    assert llm.block_manager.num_hit_tokens > hits_before
    # and all at once (the GPU test's reruns): one prefill step of several cached prefixes
    together = llm.generate([ps[i] for i in rerun], GREEDY, use_tqdm=False)
    for i, tokens, output in zip(rerun, again, together):
        assert tokens == out[i] and output.token_ids == out[i], i
    # the prompts' blocks as the reruns left them (cached by the busy run, through preemptions,
    # generated-token blocks, lookahead writes): a prefix-hit prefill equals a full one, which an
    # engine of its own computes (its allocations would evict the blocks under test); the last
    # rerun first, its blocks the most recently freed
    ref = make_llm(model_dir, num_kvcache_blocks=64)
    num_hits = 0
    for i in reversed(rerun):
        hits, last = prefix_hit_logits(llm, ps[i])
        num_hits += hits
        full = teacher_forced_logits(ref, ps[i])[-1]
        assert (last - full).abs().max().item() <= 1e-4, (i, hits)
    assert num_hits > 0
    for prompt, tokens in zip(ps, out):
        assert_greedy_of_full_prefill(ref, prompt, tokens)
    bm = llm.block_manager
    assert bm.num_free_blocks == bm.num_blocks
