"""Greedy decoding of the offline engine equals transformers token for token (float32, CPU), also under
prefix-cache hits, preemption, chunked prefill and aborts; every run returns all KV blocks."""

import pytest
import torch

from nanoserve.worker import LLM, SamplingParams
from tests.unit.hf_reference import EOS, hf_greedy, make_hf_model, prompts_of

MAX_NEW = 32
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)

CONFIGS = {
    "untied_gqa2": dict(),
    "tied_gqa1": dict(tie_word_embeddings=True, num_key_value_heads=4),
    "gqa4_headdim16": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16),
    "mha_rope1e6": dict(
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
}


def assert_clean(llm: LLM) -> None:
    """All blocks free, and every prefix-cache entry points at a block holding exactly its tokens."""
    bm = llm.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    for h, block_id in bm.hash_to_block_id.items():
        block = bm.blocks[block_id]
        assert block.hash == h and len(block.token_ids) == bm.block_size
    assert not llm.requests and llm.is_finished()


@pytest.fixture(scope="module", params=list(CONFIGS))
def model_and_ref(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf_model(path, **CONFIGS[request.param])
    prompts = prompts_of([1, 5, 17, 40, 64, 100])
    return path, prompts, hf_greedy(hf, prompts, MAX_NEW)


def test_greedy_matches_transformers(model_and_ref):
    path, prompts, ref = model_and_ref
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in out] == ref
    assert all(o.finish_reason == "length" for o in out)
    assert_clean(llm)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    path = tmp_path_factory.mktemp("untied")
    return path, make_hf_model(path)


def test_prefix_cache_hits_give_same_tokens(untied):
    path, hf = untied
    shared_prefix = prompts_of([48], seed=1)[0]
    prompts = [
        shared_prefix + [7, 8, 9],
        shared_prefix + [10],
        shared_prefix[:40],
        shared_prefix + [7, 8, 9],
    ]
    ref = hf_greedy(hf, prompts, MAX_NEW)
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    # first run fills the cache, second run hits it; within a run identical prompts share too
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    assert first[0].num_cached_tokens == 0
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in out] == ref
    assert out[0].num_cached_tokens == 48  # 3 full blocks of the shared prefix
    assert out[1].num_cached_tokens == 48 and out[2].num_cached_tokens == 32
    assert llm.block_manager.num_hit_tokens >= 48 * 3 + 32
    assert_clean(llm)


def test_preemption_recomputes_same_tokens(untied):
    path, hf = untied
    prompts = prompts_of([30, 31, 33, 20, 25, 40], seed=2)
    ref = hf_greedy(hf, prompts, MAX_NEW)
    # 12 blocks of 8 tokens: not enough for 6 sequences of ~60 tokens at once
    llm = LLM(path, device="cpu", kvcache_block_size=8, num_kvcache_blocks=12)
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.scheduler.num_preemptions > 0
    assert [o.token_ids for o in out] == ref
    assert_clean(llm)


def test_chunked_prefill_same_tokens(untied):
    path, hf = untied
    prompts = prompts_of([100, 7, 64, 33], seed=3)
    ref = hf_greedy(hf, prompts, MAX_NEW)
    llm = LLM(
        path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, max_num_batched_tokens=24
    )
    chunks = []
    orig = llm.model_runner.run

    def spy(seqs, is_prefill, **kw):
        if is_prefill:
            chunks.append(sum(s.num_scheduled_tokens for s in seqs))
        return orig(seqs, is_prefill, **kw)

    llm.model_runner.run = spy
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in out] == ref
    assert max(chunks) <= 24 and len(chunks) >= 204 // 24
    assert_clean(llm)


def test_abort_mid_run_leaves_others_exact(untied):
    path, hf = untied
    prompts = prompts_of([12, 30, 45, 8], seed=4)
    ref = hf_greedy(hf, prompts, MAX_NEW)
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    seqs = [llm.add_request(p, GREEDY) for p in prompts]
    waiting = llm.add_request(prompts_of([20], seed=5)[0], GREEDY)
    llm.abort(waiting.request_id)  # aborted while waiting
    steps = 0
    while not llm.is_finished():
        llm.step()
        steps += 1
        if steps == 5:
            assert llm.abort(seqs[1].request_id)  # aborted while decoding
            assert not llm.abort(seqs[1].request_id)  # idempotent
    assert seqs[1].finish_reason.value == "abort" and waiting.finish_reason.value == "abort"
    for i in (0, 2, 3):
        assert seqs[i].completion_token_ids == ref[i]
    assert_clean(llm)


def test_abort_during_chunked_prefill_frees_blocks(untied):
    path, _ = untied
    llm = LLM(
        path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, max_num_batched_tokens=16
    )
    seq = llm.add_request(prompts_of([90], seed=6)[0], GREEDY)
    llm.step()
    assert seq.block_table and 0 < seq.num_computed_tokens < seq.num_tokens
    llm.abort(seq.request_id)
    assert_clean(llm)


def test_stop_token_and_eos_and_min_tokens(untied):
    path, hf = untied
    prompt = prompts_of([10], seed=7)[0]
    ref = hf_greedy(hf, [prompt], MAX_NEW)[0]
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    stop_at = ref[5]
    first = ref.index(stop_at)
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=MAX_NEW, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0]
    assert out.token_ids == ref[: first + 1] and out.finish_reason == "stop"
    # min_tokens masks eos and the stop ids until 8 tokens are out (vLLM; transformers'
    # min_new_tokens does the same with its eos ids), so the output runs past the first stop_at
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=MAX_NEW, min_tokens=8, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0]
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=MAX_NEW,
            min_new_tokens=8,
            do_sample=False,
            eos_token_id=[stop_at, EOS],
            pad_token_id=0,
        )
    want = want[0, len(prompt) :].tolist()
    assert out.token_ids == want and stop_at not in out.token_ids[:8] and EOS not in want[:8]
    assert out.token_ids[:first] == ref[:first] and out.token_ids != ref[: first + 1]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert out.token_ids == ref[:3] and out.finish_reason == "length"
    assert_clean(llm)


def test_mixed_steps_match_transformers(untied):
    """Decode-first mixed steps: prompts arriving while others decode, one longer than the token
    budget (chunked), ride in the decodes' forward (the torch path attends each decode as a
    1-token extend) and every sequence still equals transformers' greedy tokens."""
    path, hf = untied
    prompts = prompts_of([5, 40, 17], seed=11)
    ref = hf_greedy(hf, prompts, 16)
    llm = LLM(
        path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, max_num_batched_tokens=16
    )
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    first = llm.add_request(prompts[0], sp)
    for _ in range(3):
        llm.step()
    rest = [llm.add_request(p, sp) for p in prompts[1:]]
    mixed = 0
    while not llm.is_finished():
        before = first.num_completion_tokens
        prefilling = rest[0].num_completion_tokens == 0
        llm.step()
        mixed += prefilling and first.num_completion_tokens == before + 1
    assert mixed >= 3  # the 40-token prompt's chunks never paused the first sequence
    assert [s.completion_token_ids for s in [first, *rest]] == ref
    assert_clean(llm)
