"""worker.kernels.sample_rows on CUDA over Qwen3's 151,936-token vocabulary: greedy rows equal
torch.argmax of the bf16 logits, sampled rows follow softmax(logits / T), and worker.runner.sampler.sample
routes a plain step to it."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
VOCAB = 151936


def test_greedy_equals_argmax_at_qwen_vocab():
    from nanoserve.worker.kernels.sample_rows import sample_rows

    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(256, VOCAB, device="cuda", generator=gen) * 4).bfloat16()
    logits[7, [5, 100_000]] = 30.0  # a tie across chunks
    expect = logits.float().argmax(dim=1)
    assert torch.equal(sample_rows(logits, None), expect)
    temps = torch.zeros(256, device="cuda")
    assert torch.equal(sample_rows(logits, temps, gen), expect)


def test_sampled_rows_follow_softmax_on_the_gpu():
    from nanoserve.worker.kernels.sample_rows import sample_rows

    rows, temp = 4096, 0.6
    base = torch.full((VOCAB,), -30.0, device="cuda")
    base[[3, 77_000, 151_935]] = torch.tensor([1.0, 0.5, 0.0], device="cuda")
    ids = sample_rows(base.bfloat16().repeat(rows, 1), torch.full((rows,), temp, device="cuda"))
    picked = torch.stack([(ids == t).float().mean() for t in (3, 77_000, 151_935)])
    probs = (torch.tensor([1.0, 0.5, 0.0]) / temp).softmax(0).cuda()
    assert (picked - probs).abs().max() < 0.03, (picked, probs)


def test_plain_steps_take_the_one_pass():
    from nanoserve.worker.runner import sampler

    logits = torch.randn(16, VOCAB, device="cuda").bfloat16()
    t = sampler.SamplingTensors(
        temperatures=None, top_ks=None, top_ps=None, min_ps=None, all_greedy=True
    )
    assert torch.equal(sampler.sample(logits, t), logits.float().argmax(dim=1))
