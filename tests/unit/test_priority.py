"""Request priorities (vLLM's priority policy): admission by (priority, arrival), preemption of the
lowest-priority running sequences when the cache or the batch is full; preempted sequences finish with
the tokens of an uninterrupted run and every block comes back."""

import pytest

from nanoserve.sampling import SamplingParams
from nanoserve.worker import LLM
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import make_hf_model
from tests.unit.test_engine_parity import GREEDY, assert_clean, prompts_of
from tests.unit.test_scheduler_blocks import check_invariants, make


def test_high_priority_behind_a_full_queue_starts_first():
    s = make(num_blocks=64, block_size=4, max_num_seqs=1)
    first = Sequence([1, 2, 3], SamplingParams(max_tokens=2))
    s.add(first)
    s.postprocess(*_step(s))
    queued = [Sequence([4, 5], SamplingParams(max_tokens=2)) for _ in range(5)]
    for seq in queued:
        s.add(seq)
    urgent = Sequence([6, 7], SamplingParams(max_tokens=2), priority=-1)
    s.add(urgent)
    assert s.waiting[0] is urgent  # ahead of the five that came before it
    s.postprocess(*_step(s))  # `first` ends; the batch (max_num_seqs=1) has room for one
    seqs, _ = s.schedule()
    assert seqs == [urgent]
    check_invariants(s)


def test_equal_priorities_stay_first_come_first_served():
    s = make()
    seqs = [
        Sequence([i + 2], SamplingParams(max_tokens=4), priority=p)
        for i, p in enumerate([3, 1, 3, 1])
    ]
    for seq in seqs:
        s.add(seq)
    assert list(s.waiting) == [seqs[1], seqs[3], seqs[0], seqs[2]]


def test_running_low_priority_is_preempted_for_a_waiting_high_priority():
    s = make(num_blocks=4, block_size=2, max_num_seqs=8)
    low = Sequence([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=10), priority=5)
    s.add(low)
    s.postprocess(*_step(s))  # low holds 4 of 4 blocks
    high = Sequence([7, 8], SamplingParams(max_tokens=10), priority=0)
    s.add(high)
    seqs, prefill = s.schedule()
    assert seqs == [high] and prefill
    assert list(s.waiting) == [low] and not low.block_table
    assert s.num_preemptions == 1
    check_invariants(s)


def test_decode_preemption_takes_the_lowest_priority_first():
    s = make(num_blocks=5, block_size=2, max_num_seqs=8)
    low = Sequence([1, 2], SamplingParams(max_tokens=10), priority=2)
    mid = Sequence([3, 4], SamplingParams(max_tokens=10), priority=1)
    high = Sequence([5, 6], SamplingParams(max_tokens=10), priority=0)
    for seq in (low, mid, high):
        s.add(seq)
    s.postprocess(*_step(s))  # 3 blocks used, 2 free; each needs a new block for its 3rd token
    seqs, _ = s.schedule()
    assert set(seqs) == {high, mid} and list(s.waiting) == [low]
    check_invariants(s)


def _step(s):
    seqs, _ = s.schedule()
    return seqs, [9] * len(seqs)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("priority")
    make_hf_model(path)
    return path


def test_priority_preemption_keeps_greedy_tokens(model_dir):
    prompts = prompts_of([30, 31, 33, 20, 25, 40], seed=3)
    ref = LLM(model_dir, device="cpu", kvcache_block_size=8, num_kvcache_blocks=128)
    expected = [o.token_ids for o in ref.generate(prompts, GREEDY, use_tqdm=False)]
    assert ref.scheduler.num_preemptions == 0
    # 12 blocks of 8 tokens hold about two of these at once: the later, higher-priority prompts
    # preempt the earlier ones
    llm = LLM(model_dir, device="cpu", kvcache_block_size=8, num_kvcache_blocks=12)
    out = llm.generate(prompts, GREEDY, use_tqdm=False, priority=[5, 5, 3, 3, 0, 0])
    assert llm.scheduler.num_preemptions > 0
    assert [o.token_ids for o in out] == expected
    assert_clean(llm)


def test_priority_orders_the_offline_batch(model_dir):
    llm = LLM(model_dir, device="cpu", kvcache_block_size=8, num_kvcache_blocks=64, max_num_seqs=1)
    prompts = prompts_of([5, 6, 7], seed=4)
    order = [llm.add_request(p, GREEDY, priority=pr) for p, pr in zip(prompts, [2, 1, 0])]
    finished = []
    while not llm.is_finished():
        finished += [o.seq for o in llm.step() if o.finished]
    assert finished == order[::-1]
    assert_clean(llm)
