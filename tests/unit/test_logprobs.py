"""Logprobs of the offline engine against transformers (float32, CPU): sampled-token logprobs, ranks
and top-k equal log_softmax of transformers' logits within 1e-4, prompt logprobs too (chunked
prefill, no prefix-cache hits, preemption, decode lookahead); the processed distribution equals a
hand computation; out-of-range k is refused naming the field; requests that do not ask get none."""

import pytest
import torch

from nanoserve.errors import InvalidArgument
from nanoserve.frontend.admission import Limits, validate_sampling_params
from nanoserve.proto.v1 import common_pb2
from nanoserve.sampling import Limits as EngineLimits
from nanoserve.sampling_proto import from_proto
from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.logprobs import StepLogprobs
from nanoserve.worker.runner.sampler import SamplingTensors
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import make_hf_model, prompts_of

ATOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("logprobs")
    return path, make_hf_model(path)


def hf_logprobs(hf, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(len(prompt + completion), V) log_softmax of transformers' logits at every position."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + completion])).logits[0].float()
    return logits.log_softmax(dim=-1)


def check_entry(entry: list, ref: torch.Tensor, token_id: int, k: int, atol: float = ATOL) -> None:
    """entry [token_id, logprob, rank, top_ids, top_logprobs] against one row of reference."""
    got_id, logprob, rank, top_ids, top_lps = entry
    assert got_id == token_id
    assert abs(logprob - ref[token_id].item()) < atol
    assert rank == int((ref > ref[token_id]).sum()) + 1
    top = ref.topk(k)
    assert top_ids == top.indices.tolist()
    assert torch.allclose(torch.tensor(top_lps), top.values, atol=atol)


def check_output(out, hf, k: int, prompt_k: int | None = None, atol: float = ATOL) -> None:
    prompt, completion = out.prompt_token_ids, out.token_ids
    ref = hf_logprobs(hf, prompt, completion)
    n = len(prompt)
    assert len(out.logprobs) == len(completion)
    for i, (entry, token_id) in enumerate(zip(out.logprobs, completion)):
        check_entry(entry, ref[n - 1 + i], token_id, k, atol)
    if prompt_k is not None:
        assert len(out.prompt_logprobs) == n - 1  # the first prompt token has none
        for j, entry in enumerate(out.prompt_logprobs):
            check_entry(entry, ref[j], prompt[j + 1], prompt_k, atol)


def test_greedy_and_sampled_logprobs_match_transformers(model):
    path, hf = model
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)
    prompts = prompts_of([1, 9, 30])
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5),
        SamplingParams(
            temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True, logprobs=20
        ),
        SamplingParams(temperature=1.0, seed=4, max_tokens=12, ignore_eos=True, logprobs=0),
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out, sp in zip(outs, params):
        check_output(out, hf, sp.logprobs)
    assert all(e[2] == 1 for e in outs[0].logprobs)  # greedy picks the top token
    assert all(e[3] == [] for e in outs[2].logprobs)  # k = 0: the sampled token alone


def test_prompt_logprobs_chunked_prefill_and_no_prefix_hits(model):
    path, hf = model
    llm = LLM(
        path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, max_num_batched_tokens=24
    )
    prompt = prompts_of([70], seed=1)[0]
    first = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert first[0].prompt_logprobs is None and first[0].logprobs is None
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=4)
    # the same prompt again: its blocks are cached, yet prompt logprobs compute every position
    outs = llm.generate([prompt, prompts_of([5], seed=2)[0]], sp, use_tqdm=False)
    assert outs[0].num_cached_tokens == 0
    for out in outs:
        check_output(out, hf, 2, prompt_k=4)
    again = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert again[0].num_cached_tokens == 64  # the cache still serves requests that do not ask


def test_prompt_logprobs_once_under_preemption(model):
    path, hf = model
    prompts = prompts_of([30, 31, 33, 20, 25, 40], seed=3)
    llm = LLM(path, device="cpu", kvcache_block_size=8, num_kvcache_blocks=12)
    sp = SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, logprobs=1, prompt_logprobs=1
    )
    outs = llm.generate(prompts, sp, use_tqdm=False)
    assert llm.scheduler.num_preemptions > 0
    for out in outs:
        check_output(out, hf, 1, prompt_k=1)


def test_logprobs_with_decode_lookahead(model):
    path, hf = model
    llm = LLM(
        path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64, decode_lookahead=True
    )
    sp = [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
    ]
    outs = llm.generate(prompts_of([12, 7], seed=4), sp, use_tqdm=False)
    assert llm.model_runner.num_foreseen_steps > 0
    check_output(outs[0], hf, 3)
    assert outs[1].logprobs is None


def test_processed_logprobs_equal_hand_computation(model):
    path, hf = model
    llm = LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    prompt = prompts_of([10], seed=5)[0]
    temperature, top_k, penalty = 0.7, 6, 1.3
    sp = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        repetition_penalty=penalty,
        seed=1,
        max_tokens=6,
        ignore_eos=True,
        logprobs=8,
        logprobs_mode="processed",
    )
    out = llm.generate([prompt], sp, use_tqdm=False)[0]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.token_ids])).logits[0].float()
    n = len(prompt)
    for i, (entry, token_id) in enumerate(zip(out.logprobs, out.token_ids)):
        row = logits[n - 1 + i].clone()
        seen = torch.tensor(sorted(set(prompt + out.token_ids[:i])))
        row[seen] = torch.where(row[seen] > 0, row[seen] / penalty, row[seen] * penalty)
        row = row / temperature
        kth = row.topk(top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
        ref = row.log_softmax(dim=-1)
        assert entry[0] == token_id and abs(entry[1] - ref[token_id].item()) < ATOL
        assert entry[3][:top_k] == ref.topk(top_k).indices.tolist()
        assert torch.allclose(torch.tensor(entry[4][:top_k]), ref.topk(top_k).values, atol=ATOL)
        assert entry[4][top_k:] == [float("-inf")] * (8 - top_k)  # filtered out


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [21, -1])
def test_out_of_range_k_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: must be in \\[0, 20\\]"):
        SamplingParams(**{field: value})
    proto = common_pb2.SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        from_proto(proto, EngineLimits(100, 512), frontend=False)
    limits = Limits(100, 512, 4, 64, 1 << 20)
    with pytest.raises(InvalidArgument, match=f"^sampling_params.{field}:"):
        validate_sampling_params(proto, limits)
    validate_sampling_params(common_pb2.SamplingParams(**{field: 20}), limits)
    with pytest.raises(InvalidArgument, match="^sampling_params.logprobs_mode:"):
        validate_sampling_params(common_pb2.SamplingParams(logprobs_mode=7), limits)


def test_no_device_work_when_no_row_asks():
    seqs = [Sequence([1, 2], SamplingParams()) for _ in range(3)]
    t = SamplingTensors(None, None, None, None, all_greedy=True)
    logits = torch.randn(3, 50)
    assert StepLogprobs.compute(logits, logits.argmax(-1), seqs, t) is None


def test_logprobs_under_tensor_parallelism(model):
    """tp=2 on gloo: every rank computes the same logit rows (prompt positions included); rank 0
    computes the logprobs."""
    path, hf = model
    llm = LLM(
        path, device="cpu", tensor_parallel_size=2, kvcache_block_size=16, num_kvcache_blocks=32
    )
    try:
        sp = SamplingParams(
            temperature=0, max_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=1
        )
        out = llm.generate(prompts_of([20], seed=6), sp, use_tqdm=False)[0]
        check_output(out, hf, 2, prompt_k=1)
    finally:
        llm.shutdown()
