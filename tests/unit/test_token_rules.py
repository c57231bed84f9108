"""logit_bias and allowed_token_ids in the sampler and its per-step inputs: a +100 bias forces a token
(greedy and sampled), -100 bans it, allowed ids restrict the draw, other rows of the batch stay as
they were, and a batch without them builds nothing."""

import pytest
import torch

from nanoserve.sampling import SamplingParams
from nanoserve.worker.runner.sampler import SamplingTensors, adjusted_logits, sample
from nanoserve.worker.runner.sampling_inputs import SamplingInputs
from nanoserve.worker.sequence import Sequence

VOCAB = 50


def prepared(params: list[SamplingParams]) -> SamplingTensors:
    """The step's tensors for one sequence per params (one prompt token each)."""
    return SamplingInputs(torch.device("cpu"), VOCAB).prepare([Sequence([3], p) for p in params])


def draw(logits: torch.Tensor, t: SamplingTensors, seed: int = 0) -> torch.Tensor:
    return sample(logits, t, torch.Generator().manual_seed(seed))


def test_a_large_bias_forces_a_token_greedy_and_sampled():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    forced = int(logits[0].argmin())  # the least likely token of row 0
    params = [
        SamplingParams(temperature=0, logit_bias={forced: 100}),
        SamplingParams(temperature=1.0, logit_bias={forced: 100.0, 5: -3.0}),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0),
    ]
    t = prepared(params)
    plain = draw(logits, prepared([SamplingParams(temperature=p.temperature) for p in params]))
    for seed in range(20):
        ids = draw(logits, t, seed)
        assert ids[:2].tolist() == [forced, forced]
    # rows without a bias draw what they drew without any row having one (the same noise)
    assert torch.equal(draw(logits, t)[2:], plain[2:])


def test_minus_100_bans_a_token():
    logits = torch.zeros(2000, VOCAB)
    logits[:, 7] = 5.0  # the favourite, by far
    t = prepared([SamplingParams(temperature=1.0, logit_bias={7: -100})] * 2000)
    assert 7 not in draw(logits, t).tolist()
    greedy = prepared([SamplingParams(temperature=0, logit_bias={7: -100})])
    assert draw(logits[:1], greedy).item() != 7


def test_allowed_token_ids_restrict_the_draw_to_their_renormalized_softmax():
    n = 20_000
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))
    allowed = [4, 11, 30]
    t = prepared([SamplingParams(temperature=1.0, allowed_token_ids=allowed)] * n)
    ids = draw(logits.repeat(n, 1), t, seed=3)
    freq = torch.bincount(ids, minlength=VOCAB).float() / n
    assert set(ids.unique().tolist()) <= set(allowed)
    want = torch.zeros(VOCAB)
    want[allowed] = logits[allowed].softmax(-1)
    assert torch.all((freq - want).abs() <= 5 * torch.sqrt(want * (1 - want) / n) + 1e-3)
    # greedy: the best allowed token, not the best token
    greedy = prepared([SamplingParams(temperature=0, allowed_token_ids=allowed)])
    assert draw(logits[None], greedy).item() == allowed[int(logits[allowed].argmax())]


def test_only_the_rows_that_ask_change_in_a_mixed_batch():
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(4))
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, logit_bias={2: 1.5, 9: -4.0}),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, allowed_token_ids=(6, 8), logit_bias={8: 2.0}),
        SamplingParams(temperature=0.5, top_k=5),
    ]
    t = prepared(params)
    before = logits.clone()
    out = adjusted_logits(logits, t)
    want = logits.clone()
    want[1, 2] += 1.5
    want[1, 9] -= 4.0
    want[3] = float("-inf")
    want[3, 6], want[3, 8] = logits[3, 6], logits[3, 8] + 2.0
    assert torch.equal(out, want)
    # the logits given are left as they were (they may view a CUDA graph's output buffer)
    assert torch.equal(logits, before)
    half = logits.bfloat16()
    assert torch.equal(adjusted_logits(half, t), adjusted_logits(half.float(), t))


def test_the_inputs_are_sparse_pairs_and_follow_the_sequences():
    inputs = SamplingInputs(torch.device("cpu"), VOCAB)
    seqs = [
        Sequence([1], SamplingParams(logit_bias={4: 1.0, 40: -2.0})),
        Sequence([1], SamplingParams()),
        Sequence([1], SamplingParams(allowed_token_ids=[3, 5, 7])),
    ]
    t = inputs.prepare(seqs)
    assert t.logit_bias is not None and t.allowed_token_ids is not None
    rows, ids, biases = t.logit_bias
    assert sorted(zip(rows.tolist(), ids.tolist(), biases.tolist())) == [(0, 4, 1.0), (0, 40, -2.0)]
    restricted, rows, ids = t.allowed_token_ids
    assert restricted.tolist() == [2]
    assert list(zip(rows.tolist(), ids.tolist())) == [(2, 3), (2, 5), (2, 7)]
    # the second step reuses each sequence's tensors, in its new row; release forgets them
    assert inputs.prepare(seqs[1:]).allowed_token_ids[0].tolist() == [1]
    assert len(inputs.token_rules.rules) == 2
    for seq in seqs:
        inputs.release(seq)
    assert not inputs.token_rules.rules


def test_a_batch_without_them_builds_and_runs_nothing(monkeypatch):
    from nanoserve.worker.runner import sampler
    from nanoserve.worker.runner.token_rules import TokenRules

    def unexpected(*args):
        raise AssertionError("token-rule work in a batch without logit_bias or allowed_token_ids")

    monkeypatch.setattr(TokenRules, "fill", unexpected)
    monkeypatch.setattr(sampler, "apply_token_rules", unexpected)
    params = [SamplingParams(temperature=1.0, repetition_penalty=1.2), SamplingParams(seed=3)]
    t = prepared(params)
    assert t.logit_bias is None and t.allowed_token_ids is None
    draw(torch.randn(2, VOCAB), t)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(logit_bias={1: 100.5}), r"logit_bias: the bias of token 1 must be a finite number"),
        (dict(logit_bias={1: float("nan")}), "logit_bias: the bias of token 1"),
        (dict(logit_bias={-1: 1.0}), "logit_bias: token id -1 must be >= 0"),
        (dict(logit_bias={"x": 1.0}), "logit_bias: must map token ids to numbers"),
        (dict(logit_bias={i: 1.0 for i in range(1025)}), "logit_bias: at most 1024 entries"),
        (dict(allowed_token_ids=[]), "allowed_token_ids: must not be empty"),
        (dict(allowed_token_ids=[2, -3]), r"allowed_token_ids\[1\]: token id -3 must be >= 0"),
        (dict(allowed_token_ids=range(65_537)), "allowed_token_ids: at most 65536 ids"),
    ],
)
def test_sampling_params_refuse_bad_values_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_sampling_params_normalize_and_cross_a_msgpack_frame():
    import msgpack

    sp = SamplingParams(logit_bias={5: 100, 6: -1.5}, allowed_token_ids=[5, 6, 9])
    assert sp.logit_bias == {5: 100.0, 6: -1.5} and sp.allowed_token_ids == (5, 6, 9)
    assert SamplingParams(logit_bias={}).logit_bias is None
    fields = msgpack.unpackb(msgpack.packb(sp.as_fields()))  # str map keys only (strict_map_key)
    assert SamplingParams(**fields) == sp
    assert sp.for_completion(1) is sp and SamplingParams(seed=1, logit_bias={5: 1}).for_completion(
        2
    ).logit_bias == {5: 1.0}
