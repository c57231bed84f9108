"""Sampler: greedy, filtered-softmax distributions, penalties, and seeds independent of the batch."""

import pytest
import torch

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.sampler import SamplingTensors, sample
from tests.unit.hf_reference import make_hf_model


def tensors(
    b: int, temperature: float = 1.0, top_k=None, top_p=None, min_p=None
) -> SamplingTensors:
    full = lambda v, dt=torch.float32: None if v is None else torch.full((b,), v, dtype=dt)
    return SamplingTensors(
        temperatures=full(temperature),
        top_ks=full(top_k, torch.long),
        top_ps=full(top_p),
        min_ps=full(min_p),
        max_top_k=top_k,  # with a top-k: filter_logits takes torch.topk, not a sort
    )


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, 0.2])


def expected(temperature=1.0, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """The filtered softmax, computed the plain way: top-k, then top-p, then min-p."""
    p = (LOGITS / temperature).softmax(-1)
    keep = torch.ones_like(p, dtype=torch.bool)
    order = p.argsort(descending=True)
    if top_k is not None:
        keep[order[top_k:]] = False
    if top_p is not None:  # over the top-k survivors, renormalized (vLLM's order)
        renorm = torch.where(keep, p, torch.zeros_like(p))
        renorm /= renorm.sum()
        mass = 0.0
        for rank, i in enumerate(order.tolist()):
            if mass >= top_p and rank > 0:
                keep[i] = False
            mass += renorm[i].item()
    if min_p is not None:
        keep &= p >= min_p * p.max()
    q = torch.where(keep, p, torch.zeros_like(p))
    return q / q.sum()


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(temperature=0.7),
        dict(top_k=3),
        dict(top_p=0.8),
        dict(min_p=0.2),
        dict(top_k=5, top_p=0.9, temperature=1.3),
    ],
)
def test_distribution_matches_filtered_softmax(kw):
    n = 40000
    gen = torch.Generator().manual_seed(0)
    ids = sample(LOGITS.repeat(n, 1), tensors(n, **kw), gen)
    freq = torch.bincount(ids, minlength=len(LOGITS)).float() / n
    want = expected(**kw)
    assert torch.all(freq[want == 0] == 0), "a filtered token was sampled"
    # 5 sigma of a binomial proportion
    tol = 5 * torch.sqrt(want * (1 - want) / n) + 1e-3
    assert torch.all((freq - want).abs() <= tol), (freq, want)


@pytest.mark.parametrize("top_p", [None, 0.9, 0.3])
def test_top_k_prefilter_keeps_what_the_sort_keeps(top_p):
    """Rows whose top-k the host knows (max_top_k) filter from torch.topk of max_top_k columns:
    the same tokens kept, with the same logits, as the sort of the whole vocabulary."""
    from nanoserve.worker.runner.sampler import filter_logits

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5000, generator=gen) * 3
    ks = torch.tensor([1, 5, 20, 20, 100, 7])
    t = SamplingTensors(
        temperatures=torch.ones(6),
        top_ks=ks,
        top_ps=None if top_p is None else torch.full((6,), top_p),
        min_ps=None,
        max_top_k=100,
    )
    fast = filter_logits(logits, t)
    t.max_top_k = None  # unknown: the sort of the whole row
    slow = filter_logits(logits, t)
    assert torch.equal(fast.isfinite(), slow.isfinite())
    assert torch.equal(fast[fast.isfinite()], slow[slow.isfinite()])
    kept = fast.isfinite().sum(-1)
    assert (kept <= ks).all() and (kept >= 1).all()
    if top_p is None:
        assert torch.equal(kept, ks)
    t.max_top_k = 5000  # past TOP_K_PREFILTER: the sort again, the same result
    assert torch.equal(filter_logits(logits, t).isfinite(), slow.isfinite())


def test_greedy_rows_take_argmax_in_mixed_batch():
    logits = torch.randn(6, 50)
    t = tensors(6)
    t.temperatures[::2] = 0
    ids = sample(logits, t, torch.Generator().manual_seed(1))
    assert torch.equal(ids[::2], logits[::2].argmax(-1))


def test_penalties_shift_logits():
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    t = tensors(1, temperature=0.0)
    t.repetition_penalties = torch.tensor([2.0])
    t.presence_penalties = torch.tensor([0.5])
    t.frequency_penalties = torch.tensor([0.25])
    t.prompt_mask = torch.tensor([[False, True, True, False]])
    t.output_counts = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    from nanoserve.worker.runner.sampler import apply_penalties

    out = apply_penalties(logits, t)
    # token1 (prompt, >0): 2/2=1; token2 (prompt, <0): -1*2=-2; token3 (output x2): 0.5/2-0.5-0.5
    assert torch.allclose(out, torch.tensor([[1.0, 1.0, -2.0, 0.25 - 0.5 - 0.5]]))


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampler_model")
    make_hf_model(path)
    return LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)


def test_seed_is_reproducible_and_batch_independent(llm):
    prompt = [5, 9, 33, 2, 17, 8]
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate([prompt], sp, use_tqdm=False)[0].token_ids
    others = [[11, 12, 13], [40] * 30, [7, 7, 7, 7]]
    noisy = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    batch = llm.generate(
        others[:2] + [prompt] + others[2:], [noisy, noisy, sp, noisy], use_tqdm=False
    )
    assert batch[2].token_ids == alone
    other_seed = SamplingParams(
        temperature=1.0, top_p=0.95, seed=99, max_tokens=20, ignore_eos=True
    )
    assert llm.generate([prompt], other_seed, use_tqdm=False)[0].token_ids != alone


def test_top_k_1_equals_greedy(llm):
    prompts = [[5, 9, 33], [100, 200, 300, 400]]
    greedy = llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False
    )
    top1 = llm.generate(
        prompts,
        SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_repetition_penalty_changes_greedy_output(llm):
    prompt = [5, 5, 5, 5, 6, 6, 6]
    plain = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False
    )[0].token_ids
    penalized = llm.generate(
        [prompt],
        SamplingParams(
            temperature=0,
            max_tokens=24,
            ignore_eos=True,
            repetition_penalty=5.0,
            frequency_penalty=2.0,
        ),
        use_tqdm=False,
    )
    tokens = penalized[0].token_ids
    assert tokens != plain
    # a frequency penalty of 2 makes repeats rare
    assert len(set(tokens)) > len(set(plain)) or len(set(tokens)) >= len(tokens) // 2


def test_penalty_tensors_count_prompt_and_output_per_sequence(llm):
    from nanoserve.worker.sequence import Sequence

    seqs = []
    for prompt, output in [([5, 5, 9], [9, 9, 3]), ([7], []), ([1, 2], [2, 8, 8, 8])]:
        seq = Sequence(prompt, SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5))
        seq.token_ids += output
        seqs.append(seq)
    t = llm.model_runner.prepare_sample(seqs)
    for i, seq in enumerate(seqs):
        prompt, output = seq.token_ids[: seq.num_prompt_tokens], seq.completion_token_ids
        row = t.penalty_rows[i]  # the statistics persist between steps, one row per sequence
        assert set(t.prompt_mask[row].nonzero().flatten().tolist()) == set(prompt)
        counts = {tok: output.count(tok) for tok in output}
        got = {
            int(k): int(t.output_counts[row, k]) for k in t.output_counts[row].nonzero().flatten()
        }
        assert got == counts
    assert torch.allclose(t.repetition_penalties, torch.tensor([1.3] * 3))


def test_min_tokens_masks_eos_and_stop_ids_until_reached(llm):
    """vLLM semantics: a row under min_tokens never samples eos or a stop id (before: the stop id
    was sampled and only the finish was refused, so it repeated inside the output)."""
    from nanoserve.worker.sequence import Sequence

    eos = llm.model_config.eos_token_ids[0]
    under = Sequence([5, 6], SamplingParams(temperature=0, min_tokens=3, stop_token_ids=(7, 9)))
    done = Sequence([5, 6], SamplingParams(temperature=0, min_tokens=1, stop_token_ids=(7,)))
    done.token_ids.append(4)  # one completion token: min_tokens reached
    free_eos = Sequence([5, 6], SamplingParams(temperature=0, min_tokens=3, ignore_eos=True))
    t = llm.model_runner.prepare_sample([under, done, free_eos])
    banned = sorted(zip(*(x.tolist() for x in t.banned)))
    assert banned == sorted([(0, 7), (0, 9), (0, eos)])
    logits = torch.zeros(3, llm.model_config.vocab_size)
    logits[:, 7] = 5.0
    logits[:, eos] = 4.0
    logits[:, 9] = 3.0
    assert sample(logits, t).tolist() == [0, 7, 7]  # row 0 falls to the best allowed token


def test_min_tokens_with_a_stop_id_the_model_emits(llm):
    prompt = [9, 11, 13, 0, 5, 77]
    plain = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )[0].token_ids
    stop = plain[1]
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=8, min_tokens=6, stop_token_ids=[stop]),
        use_tqdm=False,
    )[0]
    assert stop not in out.token_ids[:6]
    assert out.token_ids[0] == plain[0] or plain[0] == stop


def test_penalty_counts_persist_and_follow_each_step():
    """The penalties' statistics are kept between steps and updated with the new tokens only;
    over steps with finished sequences (slots reused), new ones and rows without penalties, each
    row equals a count from scratch."""
    import random
    from collections import Counter

    from nanoserve.worker.runner.sampling_inputs import SamplingInputs
    from nanoserve.worker.sequence import Sequence

    rng, vocab = random.Random(3), 40
    inputs = SamplingInputs(torch.device("cpu"), vocab)
    penalized = SamplingParams(repetition_penalty=1.2, presence_penalty=0.3)
    live: list[Sequence] = []
    for step in range(30):
        if len(live) < 6 or rng.random() < 0.2:
            sp = penalized if rng.random() < 0.7 else SamplingParams()
            live.append(Sequence([rng.randrange(vocab) for _ in range(rng.randrange(1, 9))], sp))
        if rng.random() < 0.2:
            inputs.release(live.pop(rng.randrange(len(live))))
        batch = [s for s in live if rng.random() < 0.8]  # some sit a step out (a prefill step)
        if not any(s.sampling_params.has_penalties for s in batch):
            continue
        t = inputs.prepare(batch)
        for i, seq in enumerate(batch):
            row = int(t.penalty_rows[i])
            mask = set(t.prompt_mask[row].nonzero().flatten().tolist())
            counts = {
                k: int(t.output_counts[row, k]) for k in range(vocab) if t.output_counts[row, k]
            }
            if seq.sampling_params.has_penalties:
                assert mask == set(seq.token_ids[: seq.num_prompt_tokens])
                assert counts == dict(Counter(seq.completion_token_ids))
            else:
                assert row == 0 and not mask and not counts
        for seq in batch:
            seq.append_token(rng.randrange(vocab))
    assert len(inputs.penalty_counts.slot_of) <= len(live)
