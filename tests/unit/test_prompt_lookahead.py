"""Prompt lookahead (EngineConfig.lookahead_prompts): the step after any step, mixed steps included,
scheduled one step early and forwarded before this step's ids reach the host, changes no token.
Checked on CPU (the eager path) against the engine without any lookahead, with requests arriving
between steps, chunked prompts, prefix hits, stop ids, aborts, n > 1, prompt logprobs, preemption."""

import random

import numpy as np
import pytest

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.core.block_manager import BlockManager
from nanoserve.worker.core.scheduler import Scheduler
from nanoserve.worker.runner.lookahead import Foreseen, foreseen_rows, planned_inputs
from nanoserve.worker.runner.prepare import prepare_decode, prepare_prefill
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import make_hf_model, prompts_of


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompt-lookahead")
    make_hf_model(path)
    return path


def make_llm(path, mode: str, **kw) -> LLM:
    """mode: off (no lookahead), decode (decode lookahead only), prompts (both)."""
    args = dict(device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)
    return LLM(
        path,
        decode_lookahead=mode != "off",
        lookahead_prompts=mode == "prompts",
        **{**args, **kw},
    )


def run_arrivals(llm: LLM, arrivals: list[tuple[int, list[int], SamplingParams]], aborts=()):
    """Adds request i at step arrivals[i][0] (several may share a step), aborts request j after
    step k for each (j, k) in aborts, steps until all ended; (completion ids, reason) per request,
    and the ended Sequences' count of foreseen steps."""
    seqs: list[Sequence | None] = [None] * len(arrivals)
    step = 0
    while step <= max(a[0] for a in arrivals) or not llm.is_finished():
        for i, (at, prompt, sp, *priority) in enumerate(arrivals):
            if at == step:
                seqs[i] = llm.add_request(prompt, sp, priority=priority[0] if priority else 0)
        for j, k in aborts:
            if k == step and seqs[j] is not None:
                llm.abort(seqs[j].request_id)
        llm.step()
        step += 1
        assert step < 2000
    out = []
    for seq in seqs:
        assert seq is not None
        group = seq.group if seq.group is not None else [seq]
        out.append(tuple((tuple(s.completion_token_ids), str(s.finish_reason)) for s in group))
    return out


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


CASES = {
    # Poisson-like arrivals while others decode: mixed steps forwarded ahead
    "arrivals": dict(
        arrivals=[(0, 9, greedy(20)), (3, 14, greedy(12)), (4, 30, greedy(16)), (9, 5, greedy(9)),
                  (9, 21, greedy(14)), (15, 40, greedy(6)), (22, 7, greedy(10))],
    ),
    # prompts longer than a step's budget: chunks planned one after another
    "chunks": dict(
        arrivals=[(0, 12, greedy(20)), (2, 70, greedy(8)), (3, 45, greedy(8)), (12, 90, greedy(5))],
        kw=dict(max_num_batched_tokens=32),
    ),
    "prefix_hits": dict(
        arrivals=[(0, 40, greedy(12)), (2, 40, greedy(12)), (5, 40, greedy(12))],
        same_prefix=True,
    ),
    "stop_ids_and_seeds": dict(
        arrivals=[(i * 2, 6 + 5 * i, SamplingParams(temperature=0.9, seed=i, max_tokens=25,
                                                    stop_token_ids=[7, 11, 13, 100 + i]))
                  for i in range(6)],
    ),
    "aborts": dict(
        arrivals=[(0, 10, greedy(20)), (1, 12, greedy(20)), (2, 33, greedy(20)), (6, 8, greedy(9))],
        aborts=[(2, 3), (1, 7), (3, 6)],  # (2, 3): aborted while planned into step 3
    ),
    "n_best_of": dict(
        arrivals=[(0, 9, greedy(10)), (2, 13, SamplingParams(temperature=0.8, seed=3, n=3,
                                                             max_tokens=7)), (3, 6, greedy(8))],
    ),
    "prompt_logprobs": dict(
        arrivals=[(0, 9, greedy(10)), (2, 17, greedy(6, prompt_logprobs=2)), (4, 6, greedy(8))],
    ),
    "preemption": dict(
        arrivals=[(i, 20 + 3 * i, greedy(24)) for i in range(6)],
        kw=dict(num_kvcache_blocks=12),
    ),
    "full_batch": dict(
        arrivals=[(i // 2, 5 + i, greedy(10 + i % 4)) for i in range(9)],
        kw=dict(max_num_seqs=3),
    ),
    # a priority other than 0: no plan while priorities may preempt, plans again once idle
    "priorities": dict(
        arrivals=[(0, 9, greedy(14)), (2, 20, greedy(8), 1), (3, 12, greedy(8), -1),
                  (30, 7, greedy(6)), (31, 15, greedy(6))],
        kw=dict(max_num_seqs=2),
    ),
    "logprobs": dict(
        arrivals=[(0, 9, greedy(12, logprobs=3)), (2, 14, greedy(6, logprobs=1)),
                  (3, 6, SamplingParams(temperature=0.8, seed=1, max_tokens=8, logprobs=2))],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_same_tokens_as_without_lookahead(model, case):
    spec = CASES[case]
    rng = random.Random(len(case))
    shared = [rng.randrange(2, 512) for _ in range(32)]
    arrivals = []
    for k, (at, n, sp, *priority) in enumerate(spec["arrivals"]):
        prompt = prompts_of([n], seed=100 + k)[0]
        if spec.get("same_prefix"):
            prompt = shared + prompt[: n - 32]
        arrivals.append((at, prompt, sp, *priority))
    outs, foreseen = {}, {}
    for mode in ("off", "decode", "prompts"):
        llm = make_llm(model, mode, **spec.get("kw", {}))
        outs[mode] = run_arrivals(llm, arrivals, spec.get("aborts", ()))
        foreseen[mode] = llm.model_runner.num_foreseen_steps
        bm = llm.block_manager
        assert bm.num_free_blocks == bm.num_blocks and not llm.requests
        assert llm.scheduler.planned is None or not llm.scheduler.waiting
    aborted = {j for j, _ in spec.get("aborts", ())}
    for mode in ("decode", "prompts"):
        for i, (got, want) in enumerate(zip(outs[mode], outs["off"])):
            if i not in aborted:
                assert got == want, (mode, i)
                continue
            # an abort lands after a step count: a prompt admitted a step later (an arrival
            # after a plan joins the step after it) has a token fewer by then, never others
            (ids, reason), (ref, ref_reason) = got[0], want[0]
            assert reason == ref_reason == "FinishReason.ABORT", (mode, i)
            short, long = sorted((ids, ref), key=len)
            assert long[: len(short)] == short and len(long) - len(short) <= 1, (mode, i)
    assert foreseen["off"] == 0
    # the steps with prompts, and those right after them, were foreseen too
    assert foreseen["prompts"] > foreseen["decode"]


def test_mixed_step_is_taken_from_the_forward_ahead(model):
    """One stream decodes, a request arrives: the mixed step that admits it is forwarded ahead
    while the stream's previous step is still unknown to the host, then taken; so is the decode
    after it."""
    llm = make_llm(model, "prompts")
    llm.add_request(prompts_of([9], seed=1)[0], greedy(12))
    llm.step()  # a's prefill (the decode after it forwarded ahead)
    llm.step()  # a decodes (its next decode forwarded ahead)
    runner = llm.model_runner
    assert runner.num_foreseen_steps == 1
    b = llm.add_request(prompts_of([14], seed=2)[0], greedy(5))
    llm.step()  # the decode forwarded ahead is taken; b is planned into the step after it
    assert runner.num_foreseen_steps == 2 and b.block_table and llm.scheduler.planned
    assert runner.foreseen is not None and runner.foreseen.x.is_prefill
    llm.step()  # the mixed step, from the forward ahead
    assert runner.num_foreseen_steps == 3 and b.num_computed_tokens == 14
    llm.step()  # the decode of both, forwarded ahead from the mixed step
    assert runner.num_foreseen_steps == 4
    while not llm.is_finished():
        llm.step()
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_planned_prompt_aborted_leaves_the_rest_of_the_step_to_take(model):
    """A prompt planned into the next step is aborted before it: the step forwarded ahead is still
    taken for the decodes in it (the prompt's KV went to blocks now free, rewritten before read)."""
    llm = make_llm(model, "prompts")
    a = llm.add_request(prompts_of([9], seed=1)[0], greedy(10))
    llm.step()
    llm.step()
    b = llm.add_request(prompts_of([14], seed=2)[0], greedy(5))
    llm.step()  # b is planned into the next step, which is forwarded ahead
    assert llm.scheduler.planned and llm.scheduler.planned[0][0] is b
    taken = llm.model_runner.num_foreseen_steps
    llm.abort(b.request_id)
    llm.step()
    assert llm.model_runner.num_foreseen_steps == taken + 1 and b.is_finished
    while not llm.is_finished():
        llm.step()
    ref = make_llm(model, "off").generate([a.token_ids[:9]], greedy(10), use_tqdm=False)[0]
    assert a.completion_token_ids == ref.token_ids
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_prefix_being_computed_is_waited_for_not_recomputed(model):
    """B shares A's first 40 tokens and arrives while A's prompt is in the step being planned
    from: planned then, B would miss A's blocks (registered after that step) and compute them
    again. It is left for the step after, and hits them as without lookahead."""
    shared = prompts_of([40], seed=9)[0]
    a_prompt = shared + prompts_of([7], seed=10)[0]
    b_prompt = shared + prompts_of([5], seed=11)[0]
    hits = {}
    for mode in ("off", "prompts"):
        llm = make_llm(model, mode)
        llm.add_request(prompts_of([9], seed=1)[0], greedy(12))
        llm.step()
        llm.step()  # something decodes
        llm.add_request(a_prompt, greedy(4))
        llm.step()  # (prompts: A planned into the next step)
        b = llm.add_request(b_prompt, greedy(4))
        while not llm.is_finished():
            llm.step()
        hits[mode] = b.num_cached_tokens
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    assert hits["prompts"] == hits["off"] == 32  # two whole blocks of 16


def test_plan_next_schedules_what_schedule_then_takes():
    bm = BlockManager(16, 4)
    s = Scheduler(4, 10, 1000, (0,), bm)
    a = Sequence([1, 2, 3], SamplingParams(max_tokens=5))
    s.add(a)
    seqs, prefill = s.schedule()
    s.postprocess(seqs, [9])
    seqs, prefill = s.schedule()  # a decodes
    b = Sequence(list(range(20, 34)), SamplingParams(max_tokens=5))  # 14 tokens: chunked by 9
    s.add(b)
    plan = s.plan_next(seqs)
    assert plan is not None and plan.decodes == [a] and plan.prompts == [(b, 0, 9)]
    assert len(a.block_table) == 2  # a's next slot (position 4) reserved
    assert b.block_table  # allocated at planning
    late = Sequence([5, 6], SamplingParams(max_tokens=5))
    s.postprocess(seqs, [8])
    s.add(late)  # arrives after the plan: not in the planned step
    seqs, prefill = s.schedule()
    assert seqs == [a, b] and prefill and b.num_scheduled_tokens == 9
    assert s.waiting[0] is b and s.planned is None
    plan = s.plan_next(seqs)  # b's next chunk (5 tokens), then late fits the budget of 10 - 1
    assert plan is not None and plan.prompts == [(b, 9, 5), (late, 0, 2)]
    assert plan.decodes == [a]


def test_plan_next_refuses_what_it_cannot_foresee():
    bm = BlockManager(16, 4)
    s = Scheduler(4, 64, 1000, (0,), bm)
    parent = Sequence([1, 2, 3], SamplingParams(max_tokens=5, n=2))
    parent.group = [parent]
    s.add(parent)
    seqs, _ = s.schedule()
    assert s.plan_next(seqs) is None  # it forks after this step
    s2 = Scheduler(4, 64, 1000, (0,), BlockManager(16, 4))
    s2.add(Sequence([1, 2, 3], SamplingParams(max_tokens=5), priority=1))
    seqs, _ = s2.schedule()
    assert s2.plan_next(seqs) is None  # priorities may preempt next step
    s3 = Scheduler(4, 64, 1000, (0,), BlockManager(16, 4))
    s3.add(Sequence([1, 2, 3], SamplingParams(max_tokens=1)))
    seqs, _ = s3.schedule()
    assert s3.plan_next(seqs) is None and s3.planned is None  # it ends by length: nothing next


def test_planned_inputs_equal_the_step_prepared_later():
    """The inputs forwarded ahead are those prepare_* builds once the step is scheduled (the
    decode ids filled in): the take rule accepts them, and refuses a step that differs."""
    bm = BlockManager(32, 4)
    s = Scheduler(4, 12, 1000, (0,), bm)
    a = Sequence([1, 2, 3, 4, 5], SamplingParams(max_tokens=9))
    s.add(a)
    seqs, _ = s.schedule()
    s.postprocess(seqs, [6])
    seqs, _ = s.schedule()
    b = Sequence(list(range(40, 55)), SamplingParams(max_tokens=4))
    s.add(b)
    plan = s.plan_next(seqs)
    assert plan is not None
    src, fx = planned_inputs(plan, seqs, 4, [])
    assert src.tolist() == [0] and fx.is_prefill and fx.input_ids[0] == 0
    s.postprocess(seqs, [7])
    fx.input_ids[:1] = [7]  # the runner fills the decodes' ids once it has them
    seqs, prefill = s.schedule()
    assert prefill and seqs == [a, b]
    x, _ = prepare_prefill(seqs, 4, [])
    for field in ("input_ids", "positions", "slot_mapping", "cu_seqlens_q", "context_lens"):
        assert np.array_equal(getattr(fx, field), getattr(x, field)), field
    f = Foreseen([q.seq_id for q in plan.seqs], fx, logits=None, forward_index=0)
    assert foreseen_rows(f, seqs, x, 4).tolist() == [0]  # b's chunk is partial: a's row alone
    # a step without b (aborted) takes a's row; the decode-form step is compared token by token
    assert foreseen_rows(f, [a], prepare_decode([a], 4), 4).tolist() == [0]
    x.input_ids[3] += 1  # another prompt token
    assert foreseen_rows(f, seqs, x, 4) is None


def test_tensor_parallel_ranks_follow_the_planned_step(model):
    """tp=2 over gloo: rank 0 publishes the planned (mixed) step and broadcasts all its ids, the
    decodes' from its device; the tokens equal tp=1 without lookahead."""
    arrivals = [
        (at, prompts_of([n], seed=200 + at)[0], greedy(m))
        for at, n, m in [(0, 9, 14), (2, 21, 8), (3, 6, 10), (7, 30, 5)]
    ]
    want = run_arrivals(make_llm(model, "off"), arrivals)
    llm = make_llm(model, "prompts", tensor_parallel_size=2)
    try:
        got = run_arrivals(llm, arrivals)
        assert llm.model_runner.num_foreseen_steps > 0
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    finally:
        llm.shutdown()
    assert got == want


@pytest.mark.parametrize("seed", range(6))
def test_random_schedules_same_tokens(model, seed):
    """Random arrivals (several in a step, or none for a while), lengths past a step's budget,
    stop ids, seeded sampling, n > 1 and aborts: prompt lookahead changes no finished completion,
    and an aborted one only by where the abort lands."""
    rng = random.Random(seed)
    arrivals, at = [], 0
    for k in range(rng.randint(6, 12)):
        at += rng.choice([0, 0, 1, 2, 5])
        n = rng.choice([3, 9, 17, 40, 70])
        kind = rng.random()
        if kind < 0.3:
            sp = SamplingParams(temperature=0.8, seed=k, max_tokens=rng.randint(2, 20))
        elif kind < 0.45:
            sp = SamplingParams(temperature=0.7, seed=k, n=2, max_tokens=rng.randint(2, 9))
        else:
            stop = [rng.randrange(2, 512) for _ in range(3)]
            sp = greedy(rng.randint(1, 24), stop_token_ids=stop)
        arrivals.append((at, prompts_of([n], seed=1000 * seed + k)[0], sp))
    aborts = [(rng.randrange(len(arrivals)), rng.randint(1, at + 6)) for _ in range(2)]
    kw = dict(max_num_batched_tokens=rng.choice([32, 64, 512]), max_num_seqs=rng.choice([3, 8]))
    outs = {}
    for mode in ("off", "prompts"):
        llm = make_llm(model, mode, **kw)
        outs[mode] = run_arrivals(llm, arrivals, aborts)
        assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    aborted = {j for j, _ in aborts}
    for i, (got, want) in enumerate(zip(outs["prompts"], outs["off"])):
        if i not in aborted:
            assert got == want, i
            continue
        for (ids, reason), (ref, ref_reason) in zip(got, want):
            if "ABORT" not in reason + ref_reason:
                assert (ids, reason) == (ref, ref_reason), i
            else:  # ended by the abort in one run at least: the shorter is a prefix
                short, long = sorted((ids, ref), key=len)
                assert long[: len(short)] == short, i


@pytest.mark.parametrize(
    "kw, on",
    [
        ({}, True),  # decode lookahead's default (on CUDA) at one rank
        ({"tensor_parallel_size": 2}, False),  # not yet run on GPUs with ranks
        ({"decode_lookahead": True}, False),  # set by hand: prompts only when asked too
        ({"decode_lookahead": False}, False),
        ({"lookahead_prompts": True, "tensor_parallel_size": 2}, True),
        ({"lookahead_prompts": False}, False),
    ],
)
def test_the_default_plans_prompts_ahead_only_beside_decode_lookaheads_default(kw, on):
    from nanoserve.worker.config import EngineConfig

    assert EngineConfig(**kw).plans_prompts_ahead() is on
