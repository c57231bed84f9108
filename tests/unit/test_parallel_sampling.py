"""n > 1 (SamplingParams.n): the n completions of a prompt share its KV blocks after the fork (ref
count n) until each writes into the last one (copy-on-write); seeded completions are distinct and
reproducible; greedy ones are identical; aborting the request frees every block."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.sampling import MAX_N
from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import make_hf_model
from tests.unit.test_engine_parity import assert_clean, prompts_of
from tests.unit.test_scheduler_blocks import check_invariants, make


def test_n_is_bounded():
    for bad in (0, -1, MAX_N + 1):
        with pytest.raises(ValueError, match="^n: must be"):
            SamplingParams(n=bad)


def test_fork_shares_the_prompt_blocks_then_copies_the_last_one():
    s = make(num_blocks=16, block_size=4, max_num_seqs=8)
    parent = Sequence([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=8, n=4))
    s.add(parent)
    seqs, _ = s.schedule()
    s.postprocess(seqs, [7])
    bm = s.block_manager
    assert len(s.running) == 4 and [q.index for q in s.running] == [0, 1, 2, 3]
    prompt_blocks = parent.block_table[:2]
    assert all(q.block_table == prompt_blocks for q in s.running)
    assert [bm.blocks[b].ref_count for b in prompt_blocks] == [4, 4]
    check_invariants(s)
    # the next step writes into block 1 (positions 5 and 6): three copies, the fourth writes in place
    seqs, prefill = s.schedule()
    assert len(seqs) == 4 and not prefill
    copies = bm.take_copies()
    assert len(copies) == 3 and {src for src, _ in copies} == {prompt_blocks[1]}
    assert bm.blocks[prompt_blocks[0]].ref_count == 4  # the full block stays shared
    assert len({q.block_table[1] for q in seqs}) == 4
    check_invariants(s)
    s.postprocess(seqs, [8, 9, 10, 11])
    for q in list(s.running):
        s.abort(q)
    assert bm.num_free_blocks == bm.num_blocks


def test_admission_keeps_a_batch_slot_for_each_completion():
    s = make(max_num_seqs=4)
    s.add(Sequence([1, 2], SamplingParams(max_tokens=8)))
    s.add(Sequence([3, 4], SamplingParams(max_tokens=8, n=4)))
    seqs, _ = s.schedule()
    assert len(seqs) == 1  # 1 + 4 completions would exceed max_num_seqs


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("parallel_sampling")
    make_hf_model(path)
    return LLM(path, device="cpu", kvcache_block_size=8, num_kvcache_blocks=96, max_num_seqs=8)


def test_seeded_n4_distinct_and_reproducible(llm):
    prompt = prompts_of([13], seed=5)
    sp = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True, n=4)
    first = llm.generate(prompt, sp, use_tqdm=False)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2, 3]
    completions = [tuple(c.token_ids) for c in first.outputs]
    assert len(set(completions)) == 4 and all(len(c) == 12 for c in completions)
    again = llm.generate(prompt, sp, use_tqdm=False)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == completions
    assert first.token_ids == first.outputs[0].token_ids
    # completion 0 keeps the seed: it is what n = 1 gives
    one = llm.generate(prompt, SamplingParams(**{**sp.as_fields(), "n": 1}), use_tqdm=False)[0]
    assert tuple(one.token_ids) == completions[0]
    assert_clean(llm)


def test_greedy_n2_identical_and_equal_to_n1(llm):
    prompts = prompts_of([16, 21], seed=6)  # a full last block, and a partial one
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    single = llm.generate(prompts, greedy, use_tqdm=False)
    pair = llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, n=2), use_tqdm=False
    )
    for one, two in zip(single, pair):
        assert [c.token_ids for c in two.outputs] == [one.token_ids, one.token_ids]
    assert_clean(llm)


def test_ref_count_n_after_the_fork_and_abort_frees_all(llm):
    prompt = prompts_of([20], seed=7)[0]  # 3 blocks of 8, the last one partial
    sp = SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True, n=4)
    parent = llm.add_request(prompt, sp, request_id="r")
    llm.step()  # prefill + fork
    group = parent.group
    assert group is not None and len(group) == 4
    bm = llm.block_manager
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [4, 4, 4]
    llm.step()  # each completion writes into the last block: copied for three of them
    assert [bm.blocks[b].ref_count for b in parent.block_table[:2]] == [4, 4]
    assert len({q.block_table[2] for q in group}) == 4
    llm.step()
    assert llm.abort("r")
    assert all(q.finish_reason is not None and q.finish_reason.value == "abort" for q in group)
    assert_clean(llm)


def test_n_over_max_num_seqs_is_refused(llm):
    with pytest.raises(ValueError, match="^n: "):
        llm.add_request([1, 2, 3], SamplingParams(n=MAX_N), request_id="big")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    num_blocks=st.integers(6, 24),
    block_size=st.sampled_from([2, 4, 8]),
    budget=st.integers(4, 40),
)
def test_random_forks_priorities_and_aborts_keep_invariants(seed, num_blocks, block_size, budget):
    """Reference counts equal the holders, and every block comes back, under any interleaving of
    n > 1 requests, priorities, copy-on-write, preemption and aborts of whole requests or of one
    completion (before the fork too)."""
    rng = random.Random(seed)
    max_num_seqs = rng.randint(1, 6)
    s = make(num_blocks, block_size, max_num_seqs=max_num_seqs, max_tokens=budget)
    capacity = num_blocks * block_size
    live: list[Sequence] = []  # each request's first sequence
    for _ in range(150):
        r = rng.random()
        if r < 0.25:
            prompt = [rng.randrange(1, 50) for _ in range(rng.randint(1, 14))]
            max_tokens = rng.randint(1, 10)
            n = rng.randint(1, max_num_seqs)
            if len(prompt) + max_tokens <= capacity:
                sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n, seed=seed)
                seq = Sequence(prompt, sp, priority=rng.randint(-2, 2))
                s.add(seq)
                live.append(seq)
        elif r < 0.32 and live:
            for q in _group(live.pop(rng.randrange(len(live)))):
                s.abort(q)
        elif r < 0.38 and live:  # one completion (LLMEngine.abort_completion's two paths)
            seq = live[rng.randrange(len(live))]
            n = seq.sampling_params.n
            if seq.group is not None and len(seq.group) < n:  # not forked: ends at the fork
                if len(seq.aborted_indices) < n - 1:
                    seq.aborted_indices.add(rng.randrange(n))
            else:
                open_ = [q for q in _group(seq) if not q.is_finished]
                if open_:
                    s.abort(rng.choice(open_))
            live = [q for q in live if not all(c.is_finished for c in _group(q))]
        else:
            seqs, _ = s.schedule()
            for src, dst in s.block_manager.take_copies():
                assert s.block_manager.blocks[dst].ref_count <= 1
            assert len(s.running) <= max_num_seqs
            s.postprocess(seqs, [rng.randrange(1, 50) for _ in seqs])
            live = [q for q in live if not all(c.is_finished for c in _group(q))]
        check_invariants(s)
    for seq in live:
        for q in _group(seq):
            s.abort(q)
    assert s.is_finished() and s.block_manager.num_free_blocks == num_blocks
    check_invariants(s)


def _group(seq: Sequence) -> list[Sequence]:
    return list(seq.group) if seq.group is not None else [seq]
