"""worker.kernels.sample_rows (Triton interpreter on CPU): greedy rows equal torch.argmax (the earliest
token on ties, across chunks too), sampled rows follow softmax(logits / T), a step's seed comes from
the generator, and worker.runner.sampler.sample takes this path only for plain steps."""

import pytest
import torch

import tests.unit.interpreted_kernels  # noqa: F401  (the interpreter and its numpy shim first)
from nanoserve.worker.kernels import sample_rows as kernel
from nanoserve.worker.runner import sampler


@pytest.fixture
def small_block(monkeypatch):
    monkeypatch.setattr(kernel, "BLOCK", 64)  # several chunks a row at test sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_equal_argmax_across_chunks(small_block, dtype):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 150, generator=gen).to(dtype)
    logits[1, 140] = 50.0  # the last, partial chunk
    logits[2, [10, 70, 130]] = 9.0  # a tie across three chunks: the earliest wins
    logits[3, [65, 66]] = 9.0  # a tie inside one chunk
    expect = logits.float().argmax(dim=1)
    assert expect[2] == 10 and expect[3] == 65
    assert torch.equal(kernel.sample_rows(logits, None), expect)
    zero = torch.zeros(5)
    assert torch.equal(kernel.sample_rows(logits, zero, torch.Generator()), expect)


def test_sampled_rows_follow_softmax_and_greedy_rows_mixed_in(small_block):
    torch.manual_seed(1)
    vocab, rows, temp = 6, 400, 0.7
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    logits = base.repeat(rows, 1)
    temps = torch.full((rows,), temp)
    temps[::10] = 0.0  # every tenth row greedy
    ids = kernel.sample_rows(logits, temps, torch.Generator().manual_seed(3))
    assert (ids[::10] == 0).all()
    sampled = torch.ones(rows, dtype=torch.bool)
    sampled[::10] = False
    freq = torch.bincount(ids[sampled], minlength=vocab).float() / sampled.sum()
    probs = (base / temp).softmax(0)
    # 360 draws: each frequency within ~4 standard errors of its probability
    assert (freq - probs).abs().max() < 4 * (probs * (1 - probs) / 360).sqrt().max()


def test_the_seed_comes_from_the_generator(small_block):
    logits = torch.zeros(64, 32)  # uniform rows: the noise alone picks
    temps = torch.ones(64)
    first = kernel.sample_rows(logits, temps, torch.Generator().manual_seed(5))
    again = kernel.sample_rows(logits, temps, torch.Generator().manual_seed(5))
    other = kernel.sample_rows(logits, temps, torch.Generator().manual_seed(6))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert len(set(first.tolist())) > 10  # rows draw apart
    with pytest.raises(ValueError, match="unit stride"):
        kernel.sample_rows(torch.zeros(32, 4).t(), None)
    assert kernel.sample_rows(torch.zeros(0, 8), None).shape == (0,)


def test_sample_uses_the_one_pass_only_for_plain_steps():
    plain = sampler.SamplingTensors(
        temperatures=torch.ones(2), top_ks=None, top_ps=None, min_ps=None
    )
    assert sampler.is_plain(plain)
    for field, value in [
        ("top_ps", torch.ones(2)),
        ("top_ks", torch.ones(2)),
        ("min_ps", torch.ones(2)),
        ("repetition_penalties", torch.ones(2)),
        ("banned", (torch.zeros(1), torch.zeros(1))),
        ("seeded", (torch.zeros(1), torch.zeros(1), torch.zeros(1))),
        ("allowed", (None, torch.zeros(1, 1))),
        ("logit_bias", (torch.zeros(1), torch.zeros(1), torch.zeros(1))),
        ("allowed_token_ids", (torch.zeros(1), torch.zeros(1), torch.zeros(1))),
    ]:
        t = sampler.SamplingTensors(
            temperatures=torch.ones(2), top_ks=None, top_ps=None, min_ps=None
        )
        setattr(t, field, value)
        assert not sampler.is_plain(t), field
