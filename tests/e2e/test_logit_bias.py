"""logit_bias and allowed_token_ids end to end on the tiny model (CPU): the gRPC client through the real
frontend and worker, WorkerService.GenerateTokens called directly, and the official `openai` SDK
through the gateway. Bad values are INVALID_ARGUMENT naming the field (a 400 naming the parameter at
the gateway), and every KV block is free afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.bad_inputs_requests import status_of
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair, assert_idle

pytestmark = pytest.mark.e2e

VOCAB = 151936
PROMPT = "The sea is"
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def words(tokenizer) -> tuple[int, int, int]:
    """Three plain words' token ids (" wave", " salt", " shore")."""
    ids = [tokenizer.encode(w, add_special_tokens=False).ids for w in (" wave", " salt", " shore")]
    assert all(len(i) == 1 for i in ids), ids
    return ids[0][0], ids[1][0], ids[2][0]


@pytest.fixture(scope="module")
def client(services: Pair) -> Iterator[Client]:
    with Client(services.frontend.address) as client:
        yield client


def test_generate_follows_logit_bias_and_allowed_token_ids(client: Client, words, services) -> None:
    wave, salt, shore = words
    out = client.generate(PROMPT, logit_bias={wave: 100}, **GREEDY)
    assert out.token_ids == [wave] * 6 and out.text == " wave" * 6
    sampled = client.generate(
        PROMPT, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True, logit_bias={salt: 100.0}
    )
    assert sampled.token_ids == [salt] * 6
    allowed = client.generate(
        PROMPT, temperature=1.0, seed=4, max_tokens=12, allowed_token_ids=[wave, salt, shore]
    )
    assert allowed.token_ids and set(allowed.token_ids) <= {wave, salt, shore}
    # -100 bans the token greedy decoding picks first
    plain = client.generate(PROMPT, **GREEDY).token_ids
    assert client.generate(PROMPT, logit_bias={plain[0]: -100}, **GREEDY).token_ids[0] != plain[0]
    assert_idle(services.worker.address)


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"logit_bias": {5: 100.5}}, "sampling_params.logit_bias: the bias of token 5"),
        ({"logit_bias": {VOCAB: 1.0}}, "sampling_params.logit_bias: token id 151936"),
        ({"logit_bias": {i: 1.0 for i in range(1025)}}, "sampling_params.logit_bias: at most"),
        ({"allowed_token_ids": [5, VOCAB]}, "sampling_params.allowed_token_ids[1]: token id"),
        ({"allowed_token_ids": [5] * 65537}, "sampling_params.allowed_token_ids: at most"),
        (  # <|im_end|>, the tiny model's eos: min_tokens would ban the only allowed id
            {"allowed_token_ids": [151645], "min_tokens": 2},
            "sampling_params.allowed_token_ids: every allowed id ends the output",
        ),
    ],
)
def test_the_frontend_refuses_naming_the_field(client: Client, sampling: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        client.generate(PROMPT, max_tokens=2, **sampling)
    assert field in refused.value.message


def test_allowed_ids_that_the_grammar_never_allows_end_the_call_naming_the_field(
    client: Client, words, services
) -> None:
    """A regex and allowed_token_ids with no token in common: INVALID_ARGUMENT naming
    allowed_token_ids when the row runs out of tokens (before: token 0 every step)."""
    with pytest.raises(InvalidArgument) as refused:
        client.generate(
            PROMPT,
            max_tokens=6,
            structured_output={"regex": "[0-9]+"},
            allowed_token_ids=list(words),  # " wave", " salt", " shore": no digit
        )
    assert "allowed_token_ids" in refused.value.message
    assert_idle(services.worker.address)


@pytest.fixture(scope="module")
def worker_stub(services: Pair) -> Iterator[worker_grpc.WorkerServiceStub]:
    with grpc.insecure_channel(services.worker.address) as channel:
        yield worker_grpc.WorkerServiceStub(channel)


def worker_request(**sampling) -> worker_pb2.GenerateTokensRequest:
    return worker_pb2.GenerateTokensRequest(
        prompt_token_ids=[785, 9396, 374], sampling_params=common_pb2.SamplingParams(**sampling)
    )


def test_generate_tokens_follows_them_and_refuses_bad_ones(worker_stub, words, services) -> None:
    wave, salt, _ = words
    ids = [
        t
        for r in worker_stub.GenerateTokens(worker_request(logit_bias={wave: 100}, **GREEDY))
        for t in r.token_ids
    ]
    assert ids == [wave] * 6
    request = worker_request(allowed_token_ids=[salt], max_tokens=3, ignore_eos=True)
    assert [t for r in worker_stub.GenerateTokens(request) for t in r.token_ids] == [salt] * 3
    for sampling, field in [
        ({"logit_bias": {5: 1000.0}}, "logit_bias: the bias of token 5"),
        ({"logit_bias": {VOCAB: 1.0}}, "logit_bias: token id 151936 is outside"),
        ({"logit_bias": {i: 1.0 for i in range(1025)}}, "sampling_params.logit_bias: at most"),
        ({"allowed_token_ids": [VOCAB]}, "allowed_token_ids[0]: token id 151936 is outside"),
        ({"allowed_token_ids": [1] * 65537}, "sampling_params.allowed_token_ids: at most"),
        (  # the tiny model's eos: min_tokens bans it, nothing would be left to sample
            {"allowed_token_ids": [151645], "min_tokens": 1},
            "allowed_token_ids: every allowed id ends the output",
        ),
    ]:
        code, details, received = status_of(
            worker_stub.GenerateTokens(worker_request(max_tokens=2, **sampling), timeout=30)
        )
        assert (code, received) == (grpc.StatusCode.INVALID_ARGUMENT, 0), details
        assert field in details
    assert_idle(services.worker.address)


def test_the_gateway_maps_them_for_the_openai_sdk(services: Pair, client: Client, words) -> None:
    openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
    wave, salt, shore = words
    gateway = start_gateway(services.frontend.address)
    try:
        sdk = openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)
        model = sdk.models.list().data[0].id
        reply = sdk.completions.create(
            model=model,
            prompt=PROMPT,
            temperature=0,
            max_tokens=6,
            logit_bias={str(wave): 100},
            extra_body={"ignore_eos": True},
        )
        assert reply.choices[0].text == " wave" * 6
        messages = [{"role": "user", "content": "Say something about the sea."}]
        chat = sdk.chat.completions.create(
            model=model,
            messages=messages,
            temperature=1.0,
            seed=5,
            max_completion_tokens=8,
            logit_bias={str(salt): -100},
            extra_body={
                "allowed_token_ids": [wave, salt, shore],
                "ignore_eos": True,
                **NO_THINKING,
            },
        )
        expected = client.chat(
            messages,
            enable_thinking=False,
            temperature=1.0,
            seed=5,
            max_tokens=8,
            logit_bias={salt: -100},
            allowed_token_ids=[wave, salt, shore],
            ignore_eos=True,
        )
        assert set(expected.token_ids) == {wave, shore}  # salt allowed, then banned by its bias
        assert chat.choices[0].message.content == expected.text
        for kwargs, param in (
            ({"logit_bias": {"sea": 1}}, "logit_bias"),
            ({"logit_bias": {"5": 500}}, "logit_bias"),  # refused by the frontend, named back
            ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),
            ({"extra_body": {"allowed_token_ids": []}}, "allowed_token_ids"),
        ):
            with pytest.raises(openai.BadRequestError) as raised:
                sdk.completions.create(model=model, prompt=PROMPT, max_tokens=2, **kwargs)
            error = raised.value.body
            assert raised.value.status_code == 400 and error["param"] == param, error
            assert error["type"] == "invalid_request_error" and param in error["message"]
    finally:
        assert gateway.stop() == 0, gateway.output()
    assert_idle(services.worker.address)
