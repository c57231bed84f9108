"""logit_bias and allowed_token_ids through the offline LLM on a tiny random Qwen3: greedy and sampled
requests follow them every step, beside requests that do not, with n > 1 forks, decode lookahead and
processed logprobs."""

import math

import pytest

from nanoserve.worker import LLM, SamplingParams
from tests.unit.hf_reference import make_hf_model

PROMPTS = [[5, 9, 33], [100, 200, 300, 400]]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("token_rules")
    make_hf_model(path)
    return path


def make_llm(path, **kw) -> LLM:
    return LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=128, **kw)


@pytest.fixture(scope="module")
def llm(model_path):
    return make_llm(model_path)


def run(llm: LLM, params: list[SamplingParams]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_a_forcing_bias_gives_its_token_every_step(llm):
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    reference = run(llm, [plain, plain])
    x = next(t for t in range(2, 512) if t not in reference[0])  # never chosen unbiased
    biased = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias={x: 100})
    out = run(llm, [biased, plain])
    assert out[0] == [x] * 12
    assert out[1] == reference[1]  # the request beside it is untouched
    # sampled, and with a repetition penalty shrinking the repeated token's biased logit
    sampled = SamplingParams(
        temperature=1.0,
        seed=3,
        max_tokens=12,
        ignore_eos=True,
        repetition_penalty=2.0,
        logit_bias={x: 100.0},
    )
    assert run(llm, [sampled, sampled]) == [[x] * 12, [x] * 12]


def test_allowed_token_ids_bound_every_completion(llm):
    a, b = 17, 250
    sp = SamplingParams(
        temperature=1.0, seed=5, n=3, max_tokens=16, ignore_eos=True, allowed_token_ids=[a, b]
    )
    out = llm.generate(PROMPTS[:1], sp, use_tqdm=False)[0]
    tokens = [t for c in out.outputs for t in c.token_ids]
    assert len(out.outputs) == 3 and len(tokens) == 48
    assert set(tokens) == {a, b}  # both, and nothing else (the forks copied the params)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, allowed_token_ids=[a, b])
    assert set(run(llm, [greedy, greedy])[1]) <= {a, b}


def test_min_tokens_with_only_ending_ids_allowed_is_refused(llm):
    """The engine checks it too (WorkerService.GenerateTokens reaches it without the frontend):
    min_tokens would ban every allowed id, leaving the row nothing to sample."""
    eos = llm.eos_token_ids[0]
    stop_only = SamplingParams(allowed_token_ids=[eos], min_tokens=2, max_tokens=4)
    with pytest.raises(ValueError, match="allowed_token_ids: every allowed id ends the output"):
        llm.generate(PROMPTS[:1], stop_only, use_tqdm=False)
    plus_one = SamplingParams(allowed_token_ids=[eos, 17], min_tokens=2, max_tokens=4)
    out = llm.generate(PROMPTS[:1], plus_one, use_tqdm=False)[0]
    assert out.token_ids[:2] == [17, 17]  # eos banned until min_tokens: 17 is all that is left


def test_decode_lookahead_changes_nothing(model_path):
    """The step forwarded ahead samples with the rules of the step it turns out to be."""
    params = [
        SamplingParams(
            temperature=1.0, seed=7, max_tokens=20, ignore_eos=True, logit_bias={44: 3.0, 45: -9}
        ),
        SamplingParams(temperature=1.0, seed=8, max_tokens=20, allowed_token_ids=[3, 4, 5, 6]),
    ]
    ahead = make_llm(model_path, decode_lookahead=True)
    assert run(ahead, params) == run(make_llm(model_path, decode_lookahead=False), params)
    assert ahead.model_runner.num_foreseen_steps > 0
    assert set(run(ahead, params)[1]) <= {3, 4, 5, 6}


def test_processed_logprobs_see_the_rules_and_raw_ones_do_not(llm):
    allowed = [17, 250]

    def entries(mode: str) -> list[list]:
        sp = SamplingParams(
            temperature=1.0,
            seed=1,
            max_tokens=6,
            ignore_eos=True,
            allowed_token_ids=allowed,
            logprobs=2,
            logprobs_mode=mode,
        )
        return llm.generate(PROMPTS[:1], sp, use_tqdm=False)[0].logprobs

    for token_id, logprob, rank, top_ids, top_logprobs in entries("processed"):
        assert token_id in allowed and rank <= 2
        assert sorted(top_ids) == allowed
        assert math.isclose(sum(math.exp(lp) for lp in top_logprobs), 1.0, rel_tol=1e-4)
    for token_id, logprob, rank, top_ids, top_logprobs in entries("raw"):
        assert token_id in allowed  # sampled under the rules, reported as the model gave it
        assert sum(math.exp(lp) for lp in top_logprobs) < 0.5  # a 512-token spread
