"""Seeded sampling on CUDA: the Triton noise kernel against the torch path (same bits as on CPU), and
seeded requests through CUDA graphs and decode lookahead that repeat on rerun, in another batch and
after preemption (a small bf16 model of Qwen3 shapes, random weights)."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_kernel_matches_the_torch_path_and_the_cpu_bits():
    from nanoserve.worker.kernels.seeded_noise import fill_seeded_exponential
    from nanoserve.worker.runner.seeded_noise import as_int64, seeded_bits, seeded_exponential

    seeds = torch.tensor([as_int64(-5), 0, 1, 2**62, 123, 77])
    positions = torch.tensor([0, 0, 1, 3, 900, 4095])
    vocab = 151936
    cpu_bits = seeded_bits(seeds, positions, vocab)
    s, p = seeds.cuda(), positions.cuda()
    assert torch.equal(seeded_bits(s, p, vocab).cpu(), cpu_bits)  # int64 wraps alike
    rows = torch.tensor([3, 0, 7, 1, 5, 2], device="cuda")
    noise = torch.full((8, vocab), -1.0, device="cuda")
    fill_seeded_exponential(noise, rows, s, p)
    want = seeded_exponential(s, p, vocab)
    torch.testing.assert_close(noise[rows], want, rtol=2e-5, atol=1e-6)
    assert (noise[[4, 6]] == -1).all()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3-small-random")
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # decisive logits (see test_engine_gpu)
        model.model.embed_tokens.weight.normal_(0, 0.5)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path


def make_llm(path, **kw):
    from nanoserve.worker import LLM

    args = dict(device="cuda", dtype="bfloat16", max_model_len=1024, max_num_seqs=32)
    return LLM(path, **{**args, "num_kvcache_blocks": 128, "kvcache_block_size": 16, **kw})


def test_seeded_requests_repeat_through_graphs_lookahead_and_preemption(model_path):
    from nanoserve.worker import SamplingParams

    prompts = [[(31 * i + 7 * j) % 5000 + 10 for j in range(n)] for i, n in enumerate([5, 60, 17])]
    seeded = [
        SamplingParams(temperature=1.0, seed=10 + i, max_tokens=40, ignore_eos=True)
        for i in range(len(prompts))
    ]
    noisy = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    llm = make_llm(model_path)
    alone = [llm.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in zip(prompts, seeded)]
    assert llm.model_runner.num_foreseen_steps > 0  # lookahead ran (on by default on CUDA)
    again = [o.token_ids for o in llm.generate(prompts, seeded, use_tqdm=False)]
    assert again == alone
    # among unseeded rows, in another order
    mixed = llm.generate(
        [prompts[2], [3] * 9, prompts[0], [4] * 30, prompts[1]],
        [seeded[2], noisy, seeded[0], noisy, seeded[1]],
        use_tqdm=False,
    )
    assert [mixed[i].token_ids for i in (2, 4, 0)] == alone
    assert len({tuple(t) for t in alone}) == 3
    # a cache too small for all three: preempted sequences recompute and draw the same noise
    tight = make_llm(model_path, num_kvcache_blocks=7)
    out = [o.token_ids for o in tight.generate(prompts, seeded, use_tqdm=False)]
    assert tight.scheduler.num_preemptions > 0
    assert out == alone
