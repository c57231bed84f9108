"""Decode lookahead (worker.runner.lookahead): forwarding step N+1 before step N's ids reach the host
changes no token. Checked on CPU (the eager path) against transformers and against the engine without
lookahead, under batches that shrink, stop tokens, seeded sampling, preemption, aborts and prefix hits."""

import numpy as np
import pytest

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.lookahead import Foreseen, foreseen_rows, next_decode_inputs
from nanoserve.worker.runner.step_inputs import StepInputs
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import hf_greedy, make_hf_model, prompts_of


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("lookahead")
    return path, make_hf_model(path)


def make_llm(path, lookahead: bool, **kw) -> LLM:
    args = dict(device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)
    return LLM(path, decode_lookahead=lookahead, **{**args, **kw})


def test_greedy_equals_transformers_and_uses_foreseen_steps(model):
    path, hf = model
    prompts = prompts_of([3, 17, 40, 64], seed=1)
    lens = [9, 32, 20, 27]  # the batch shrinks as sequences end: foreseen subsets are reused
    ref = [r[:n] for r, n in zip(hf_greedy(hf, prompts, max(lens)), lens)]
    llm = make_llm(path, True)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in out] == ref
    runner = llm.model_runner
    # every decode step but the last of the longest sequence was foreseen (blocks are reserved
    # ahead, and sequences at their last token are left out of the step forwarded ahead)
    assert runner.num_foreseen_steps == max(lens) - 2
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def run_all(llm: LLM, prompts, params, abort_after: dict[int, int]) -> list[tuple]:
    """Drive the engine step by step, aborting request i after abort_after[i] steps."""
    seqs = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    steps = 0
    while not llm.is_finished():
        llm.step()
        steps += 1
        for i, at in abort_after.items():
            if steps == at:
                llm.abort(seqs[i].request_id)
    return [(tuple(s.completion_token_ids), s.finish_reason) for s in seqs]


@pytest.mark.parametrize("case", ["stop_tokens_and_seeds", "preemption", "aborts", "prefix_hits"])
def test_same_tokens_with_and_without_lookahead(model, case):
    path, _ = model
    prompts = prompts_of([5, 33, 18, 70, 12, 40], seed=2)
    kw, abort_after = {}, {}
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True) for _ in prompts]
    if case == "stop_tokens_and_seeds":
        # seeded sampling, and stop ids that end sequences at steps the lookahead cannot foresee
        params = [
            SamplingParams(
                temperature=0.8,
                top_p=0.9,
                seed=i,
                max_tokens=30,
                stop_token_ids=[7, 11, 13, 100 + i],
            )
            for i in range(len(prompts))
        ]
    elif case == "preemption":
        kw = dict(num_kvcache_blocks=12)
    elif case == "aborts":
        abort_after = {1: 3, 3: 9}
    elif case == "prefix_hits":
        prompts = prompts + [p + [5, 6, 7] for p in prompts[:3]]
        params = params + params[:3]
    outs, foreseen = [], []
    for lookahead in (False, True):
        llm = make_llm(path, lookahead, **kw)
        outs.append(run_all(llm, prompts, params, abort_after))
        foreseen.append(llm.model_runner.num_foreseen_steps)
        bm = llm.block_manager
        assert bm.num_free_blocks == bm.num_blocks and not llm.requests
        if case == "preemption":
            assert llm.scheduler.num_preemptions > 0
    assert outs[0] == outs[1]
    assert foreseen[0] == 0 and foreseen[1] > 0
    reasons = {str(reason) for _, reason in outs[1]}
    if case == "stop_tokens_and_seeds":
        assert "FinishReason.STOP" in reasons and "FinishReason.LENGTH" in reasons
    if case == "aborts":
        assert "FinishReason.ABORT" in reasons


def decode_step(lens: list[int], tables: list[list[int]], block_size: int) -> StepInputs:
    n = len(lens)
    lens_a = np.asarray(lens)
    width = max(map(len, tables))
    bt = np.full((n, width), -1, dtype=np.int64)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = t
    last = bt[np.arange(n), (lens_a - 1) // block_size]
    return StepInputs(
        False,
        np.zeros(n, dtype=np.int64),
        lens_a - 1,
        last * block_size + (lens_a - 1) % block_size,
        np.arange(n + 1),
        lens_a,
        bt,
        np.arange(n),
        1,
        int(lens_a.max()),
    )


def seqs_of(lens: list[int], max_tokens: int = 100) -> list[Sequence]:
    return [Sequence(list(range(n)), SamplingParams(max_tokens=max_tokens)) for n in lens]


def test_next_step_needs_an_allocated_slot_and_no_certain_stop():
    seqs = seqs_of([5, 16])
    x = decode_step([5, 16], [[3], [4]], block_size=16)
    assert next_decode_inputs(x, seqs, 16, 1000) is None  # position 16 needs a second block
    x = decode_step([5, 16], [[3], [4, 9]], block_size=16)  # the second block reserved
    rows, nxt = next_decode_inputs(x, seqs, 16, 1000)
    assert rows.tolist() == [0, 1]
    assert nxt.positions.tolist() == [5, 16] and nxt.context_lens.tolist() == [6, 17]
    assert nxt.slot_mapping.tolist() == [3 * 16 + 5, 9 * 16]
    rows, nxt = next_decode_inputs(x, seqs, 16, 17)  # 16 + 1 tokens reach max_model_len
    assert rows.tolist() == [0] and nxt.slot_mapping.tolist() == [3 * 16 + 5]
    assert nxt.block_tables.tolist() == [[3, -1]]
    short = seqs_of([5, 16], max_tokens=1)  # no completion yet: the next token is the last
    assert next_decode_inputs(x, short, 16, 1000) is None


def test_foreseen_rows_accepts_an_ordered_subset_only():
    seqs = seqs_of([5, 6, 7])
    _, fx = next_decode_inputs(decode_step([5, 6, 7], [[1], [2], [3]], 16), seqs, 16, 1000)
    f = Foreseen([s.seq_id for s in seqs], fx, logits=None, forward_index=0)
    for s in seqs:
        s.append_token(0)
    same = decode_step([6, 7, 8], [[1], [2], [3]], 16)
    assert foreseen_rows(f, seqs, same, 16).tolist() == [0, 1, 2]
    subset = decode_step([6, 8], [[1], [3]], 16)
    assert foreseen_rows(f, [seqs[0], seqs[2]], subset, 16).tolist() == [0, 2]
    assert foreseen_rows(f, [seqs[2], seqs[0]], decode_step([8, 6], [[3], [1]], 16), 16) is None
    reserved = decode_step([6, 7, 8], [[1, 9], [2], [3]], 16)  # a block past the context
    assert foreseen_rows(f, seqs, reserved, 16).tolist() == [0, 1, 2]
    moved = decode_step([6, 7, 8], [[1], [5], [3]], 16)  # another block: not the foreseen step
    assert foreseen_rows(f, seqs, moved, 16) is None
    other = seqs_of([6])
    assert foreseen_rows(f, other, decode_step([6], [[1]], 16), 16) is None


def test_tensor_parallel_ranks_follow_the_step_forwarded_ahead(model):
    """tp=2 over gloo: rank 0 publishes the foreseen step and broadcasts its sampled ids; the
    tokens equal tp=1 without lookahead (seeded sampling, stops, a shrinking batch)."""
    path, _ = model
    prompts = prompts_of([5, 33, 18, 70], seed=5)
    params = [
        SamplingParams(temperature=0.7, seed=i, max_tokens=8 + 5 * i, stop_token_ids=[7, 11, 13])
        for i in range(len(prompts))
    ]
    ref = make_llm(path, False)
    want = run_all(ref, prompts, params, {})
    llm = make_llm(path, True, tensor_parallel_size=2)
    try:
        got = run_all(llm, prompts, params, {})
        assert llm.model_runner.num_foreseen_steps > 0
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    finally:
        llm.shutdown()
    assert got == want


def test_lookahead_under_a_queue(model):
    """With more requests than max_num_seqs the queue is never empty; every decode step that
    follows a decode step is still served from the forward ahead (before: only once the queue had
    drained; 38 of 117 decode steps in the review's demo), and the tokens are those of the engine
    without lookahead."""
    path, _ = model
    lens = [6, 12, 20, 5, 15, 9, 20, 4]
    prompts = prompts_of([3 + i % 5 for i in range(8)], seed=4)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    outs = []
    for lookahead in (True, False):
        llm = make_llm(path, lookahead, max_num_seqs=3, num_kvcache_blocks=64)
        seqs = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
        after_decode, prev_decode = 0, False
        while not llm.is_finished():
            before = llm.num_prompt_tokens_done
            llm.step()
            decode = llm.num_prompt_tokens_done == before
            after_decode += decode and prev_decode
            prev_decode = decode
        outs.append([s.completion_token_ids for s in seqs])
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
        if lookahead:
            assert after_decode > 25 and llm.model_runner.num_foreseen_steps == after_decode
    assert outs[0] == outs[1]


def test_decode_follows_predicts_admission():
    from nanoserve.worker.core.block_manager import BlockManager
    from nanoserve.worker.core.scheduler import Scheduler

    s = Scheduler(2, 64, 1000, (0,), BlockManager(8, 4))
    a, b = (Sequence([1, 2, 3], SamplingParams(max_tokens=5)) for _ in range(2))
    s.add(a)
    s.postprocess(*s.schedule()[:1], [4])
    seqs, prefill = s.schedule()
    assert not prefill and s.decode_follows(seqs)  # nothing waits
    s.add(b)
    assert not s.decode_follows(seqs)  # room in the batch and b fits: b is prefilled next
    s.add(Sequence([1, 2, 3], SamplingParams(max_tokens=5)))
    s.max_num_seqs = 1
    assert s.decode_follows(seqs)  # the batch is full
    a.token_ids += [5, 6, 7]  # a's next token is its fifth: it ends by length, which frees a slot
    assert not s.decode_follows(seqs)
    s.max_num_seqs, b.token_ids = 2, list(range(40))  # room, but b needs 10 blocks of 8
    assert s.decode_follows(seqs)


def test_foreseen_logits_refused_after_another_forward(model):
    """The foreseen logits may view a CUDA graph's output buffer: a forward between the step
    forwarded ahead and its use (a draft model, a second forward per step) is caught, not
    sampled."""
    path, _ = model
    llm = make_llm(path, True)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    seq = llm.add_request([5, 6, 7], sp)
    llm.step()  # prefill
    llm.step()  # decode, and the next decode forwarded ahead
    runner = llm.model_runner
    assert runner.foreseen is not None
    llm.step()  # the foreseen logits are taken: fine
    assert runner.num_foreseen_steps == 1 and runner.foreseen is not None
    runner.execute(runner.prepare_decode([seq]))  # an intervening forward
    with pytest.raises(RuntimeError, match="forward"):
        llm.step()


def test_an_arrival_takes_the_step_forwarded_ahead_first(model):
    """A request that arrives while a decode step is forwarded ahead joins the step after it: the
    forward is taken (not dropped for a mixed step that would recompute it), the running stream's
    tokens and the newcomer's equal the engine's without lookahead, and the newcomer waits one
    step, not more."""
    path, _ = model
    first, late = prompts_of([9, 14], seed=6)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = []
    for lookahead in (False, True):
        llm = make_llm(path, lookahead)
        a = llm.add_request(first, sp)
        llm.step()  # a's prefill
        llm.step()  # a decodes, and (lookahead) its next decode is forwarded ahead
        b = llm.add_request(late, sp)
        before = llm.num_prompt_tokens_done
        llm.step()
        admitted_at_once = llm.num_prompt_tokens_done > before
        llm.step()
        assert b.num_computed_tokens >= len(late)  # b is prefilled by the second step at most
        assert admitted_at_once is not lookahead
        if lookahead:
            assert llm.model_runner.num_foreseen_steps == 1
        while not llm.is_finished():
            llm.step()
        outs.append((a.completion_token_ids, b.completion_token_ids))
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    assert outs[0] == outs[1]


def test_a_prompt_that_waited_when_the_forward_was_decided_is_not_deferred(model):
    """decode_follows may judge that the head of the queue does not fit (it counts no prefix
    hits) while it does: the step forwarded ahead over that queue does not defer it, and the
    engine admits it at once, as without lookahead."""
    path, _ = model
    llm = make_llm(path, True)
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm.add_request(prompts_of([9], seed=7)[0], sp)
    llm.step()
    waited = llm.add_request([3, 4, 5], sp)
    llm.scheduler.decode_follows = lambda seqs: True  # the misjudgment: forward ahead anyway
    llm.step()  # waited is admitted (a mixed step: no forward ahead)
    assert waited.num_computed_tokens == 3
    llm.step()  # a decode step, forwarded ahead while nothing waits
    assert llm.model_runner.holds_foreseen and not llm.ahead_over_waiting
    late = llm.add_request([6, 7, 8], sp)
    llm.step()  # late arrived after that decision: deferred, the forward is taken
    assert late.num_computed_tokens == 0 and llm.model_runner.num_foreseen_steps == 1
    assert llm.model_runner.holds_foreseen and llm.ahead_over_waiting  # (the misjudgment again)
    llm.step()  # late waited when this forward was decided: admitted, the forward dropped
    assert late.num_computed_tokens == 3 and llm.model_runner.num_foreseen_steps == 1


@pytest.mark.parametrize("how", ["stop_token", "abort"])
def test_an_arrival_after_the_forwards_sequences_ended_is_served(model, how):
    """The only running sequence ends (a stop id the lookahead could not foresee, or an abort)
    while its next decode is forwarded ahead, then a request arrives: nothing can take the
    forward, so the newcomer is admitted at once, not deferred forever."""
    path, _ = model
    llm = make_llm(path, True)
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompt = prompts_of([11], seed=8)[0]
    probe = llm.generate([prompt], greedy, use_tqdm=False)[0].token_ids
    stop_at = probe[3]  # the 4th token: a stop id for the run below
    sp = SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_at])
    a = llm.add_request(prompt, sp if how == "stop_token" else greedy)
    for _ in range(3):
        llm.step()  # prefill, then decodes forwarded ahead
    if how == "abort":
        llm.abort(a.request_id)
    else:
        while not a.is_finished:
            llm.step()
    assert a.is_finished and llm.model_runner.holds_foreseen and not llm.scheduler.running
    b = llm.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    for _ in range(6):
        if llm.is_finished():
            break
        llm.step()
    assert b.is_finished and len(b.completion_token_ids) == 4
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
