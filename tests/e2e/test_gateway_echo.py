"""The gateway's echo and best_of on /v1/completions end to end: the official `openai` SDK against
the gateway in front of the real frontend and worker (tiny model, CPU), compared with the gRPC
client's answers to the same requests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nanoserve import Client
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair
from tests.top_logprobs import assert_same_top

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e

PROMPT = "The sea is wide and the sky is blue."
TOL = 1e-4


@pytest.fixture(scope="module")
def sdk(services: Pair) -> Iterator[openai.OpenAI]:
    gateway = start_gateway(services.frontend.address)
    yield openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)
    assert gateway.stop() == 0, gateway.output()


@pytest.fixture(scope="module")
def model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def test_echo_returns_the_prompt_and_the_completion(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.generate(PROMPT, max_tokens=6, temperature=0)
        prompt_ids = client.tokenize(PROMPT)
    args = {"model": model, "max_tokens": 6, "temperature": 0, "echo": True}
    reply = sdk.completions.create(prompt=PROMPT, **args)
    assert reply.choices[0].text == PROMPT + expected.text
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == expected.usage.completion_tokens
    # a token-id prompt echoes its decoded text
    by_ids = sdk.completions.create(prompt=prompt_ids, **args)
    assert by_ids.choices[0].text == PROMPT + expected.text
    # streamed: the first event carries the prompt (vLLM's way)
    events = [e for e in sdk.completions.create(prompt=PROMPT, stream=True, **args) if e.choices]
    assert events[0].choices[0].text.startswith(PROMPT)
    assert "".join(e.choices[0].text for e in events) == PROMPT + expected.text


def test_echo_with_max_tokens_0_scores_the_prompt_as_the_grpc_prompt_logprobs(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    """lm-eval-harness's loglikelihood request: echo, max_tokens 0, logprobs 1."""
    with Client(services.frontend.address) as client:
        expected = client.generate(PROMPT, max_tokens=1, temperature=0, prompt_logprobs=1)
    reply = sdk.completions.create(
        model=model, prompt=PROMPT, echo=True, max_tokens=0, logprobs=1, temperature=0
    )
    (choice,) = reply.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 0
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    entries = expected.prompt_logprobs
    assert entries is not None and len(entries) == reply.usage.prompt_tokens - 1
    logprobs = choice.logprobs
    assert logprobs.tokens[1:] == [e.text for e in entries]
    assert "".join(logprobs.tokens) == PROMPT
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx([e.logprob for e in entries], abs=TOL)
    for top, e in zip(logprobs.top_logprobs[1:], entries, strict=True):
        # the prompt token's own logprob, and the most likely token (up to a near-tie)
        assert top[e.text] == pytest.approx(e.logprob, abs=TOL)
        alternative = {t: v for t, v in top.items() if t != e.text} or {e.text: top[e.text]}
        (best,) = e.top_logprobs
        assert_same_top(
            list(alternative), list(alternative.values()), [best.text], [best.logprob], TOL
        )
    assert logprobs.text_offset == [
        sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))
    ]


def test_best_of_returns_the_completion_with_the_highest_summed_logprob(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    sampling = {"max_tokens": 8, "temperature": 1.0, "seed": 23}
    with Client(services.frontend.address) as client:
        expected = client.generate(PROMPT, n=3, logprobs=0, **sampling)
    sums = [sum(e.logprob for e in c.logprobs or ()) for c in expected.choices]
    ranked = sorted(sums, reverse=True)
    assert ranked[0] - ranked[1] > 1e-3  # a clear best: float noise cannot swap it
    reply = sdk.completions.create(model=model, prompt=PROMPT, best_of=3, n=1, **sampling)
    (choice,) = reply.choices
    assert choice.text == expected.choices[sums.index(ranked[0])].text
    assert choice.logprobs is None  # ranked with logprobs the client did not ask for
    assert reply.usage.completion_tokens == expected.usage.completion_tokens  # all three


def test_best_of_below_n_or_streamed_is_a_400_naming_best_of(
    sdk: openai.OpenAI, model: str
) -> None:
    for kwargs in ({"n": 2, "best_of": 1}, {"best_of": 2, "stream": True}):
        with pytest.raises(openai.BadRequestError) as raised:
            sdk.completions.create(model=model, prompt=PROMPT, max_tokens=2, **kwargs)
        assert raised.value.body["param"] == "best_of", kwargs
