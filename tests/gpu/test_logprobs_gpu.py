"""Logprobs on CUDA: with the decode CUDA graph and decode lookahead (the logits are a view of the
graph's output, read before the step forwarded ahead replays it) and prompt logprobs through the
prefill graphs, they equal transformers' log_softmax (float32)."""

import pytest
import torch

from tests.unit.hf_reference import make_hf_model
from tests.unit.test_logprobs import check_output, prompts_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_logprobs_with_cuda_graphs_and_lookahead(tmp_path):
    from nanoserve.worker import LLM, SamplingParams

    hf = make_hf_model(tmp_path)
    llm = LLM(
        tmp_path,
        device="cuda",
        dtype="float32",
        kvcache_block_size=16,
        num_kvcache_blocks=256,
        decode_lookahead=True,
        max_num_batched_tokens=64,
    )
    assert llm.model_runner.graphs is not None
    prompts = prompts_of([3, 40, 100, 17], seed=9)
    params = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=5),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(
            temperature=0, max_tokens=20, ignore_eos=True, logprobs=3, prompt_logprobs=2
        ),
        SamplingParams(temperature=0.9, seed=2, max_tokens=20, ignore_eos=True, logprobs=20),
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.model_runner.num_foreseen_steps > 0
    hf = hf.float()
    check_output(outs[0], hf, 5, atol=2e-3)
    assert outs[1].logprobs is None
    check_output(outs[2], hf, 3, prompt_k=2, atol=2e-3)
    check_output(outs[3], hf, 20, atol=2e-3)
    llm.shutdown()
