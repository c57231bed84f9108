"""FrontendServicer's gate against a fake worker: validation naming the field, admission control,
the client's cancel and deadline carried to the worker call."""

import asyncio
import math
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.text.tokenizer import Tokenizer
from tests.unit.frontend_fakes import MAX_MODEL_LEN, VOCAB_SIZE, Harness, _collect, _generate, run

BAD_PARAMS = [
    ({"temperature": math.nan}, "sampling_params.temperature"),
    ({"temperature": math.inf}, "sampling_params.temperature"),
    ({"temperature": -0.5}, "sampling_params.temperature"),
    ({"top_p": 0.0}, "sampling_params.top_p"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
    ({"top_k": -2}, "sampling_params.top_k"),
    ({"min_p": 1.5}, "sampling_params.min_p"),
    ({"max_tokens": 0}, "sampling_params.max_tokens"),
    ({"max_tokens": -3}, "sampling_params.max_tokens"),
    ({"max_tokens": 4, "min_tokens": 5}, "sampling_params.min_tokens"),
    ({"min_tokens": -1}, "sampling_params.min_tokens"),
    ({"min_tokens": 64}, "sampling_params.min_tokens"),  # > the room left by the prompt
    ({"repetition_penalty": 0.0}, "sampling_params.repetition_penalty"),
    ({"presence_penalty": 2.5}, "sampling_params.presence_penalty"),
    ({"frequency_penalty": -math.inf}, "sampling_params.frequency_penalty"),
    ({"stop": ["a"] * 3}, "sampling_params.stop"),
    ({"stop": ["x" * 9]}, "sampling_params.stop[0]"),
    ({"stop": ["ok", ""]}, "sampling_params.stop[1]"),
    ({"stop_token_ids": [1, VOCAB_SIZE]}, "sampling_params.stop_token_ids[1]"),
    ({"stop": ["a"], "detokenize": False}, "sampling_params.stop"),  # stop strings match text
    ({"max_tokens": MAX_MODEL_LEN}, "sampling_params.max_tokens"),  # prompt + max_tokens too long
]
BAD_REQUESTS = [
    (_generate(prompt=""), "prompt"),
    (_generate(), "prompt"),
    (_generate(prompt="a", prompt_token_ids=[1]), "prompt"),
    (_generate(prompt_token_ids=[1, VOCAB_SIZE + 5]), "prompt_token_ids[1]"),
    (_generate(prompt_token_ids=[1] * MAX_MODEL_LEN), "prompt_token_ids"),
    (_generate(prompt="x" * 2000), "prompt"),  # > max_prompt_bytes
    (_generate(prompt="a", request_id="r" * 200), "request_id"),
    (_generate(prompt="a", stream_interval=0), "stream_interval"),
    (_generate(prompt="a", stream_interval=257), "stream_interval"),
]


def test_validation_names_the_field(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        cases = [(_generate(prompt="hi", sampling_params=p), f) for p, f in BAD_PARAMS]
        for request, field in cases + BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await _collect(h.stub.Generate(request))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, exc.value)
            assert exc.value.details().startswith(field + ":"), (field, exc.value.details())
        bad_chats = [
            (frontend_pb2.ChatRequest(), "messages"),
            (
                frontend_pb2.ChatRequest(
                    messages=[frontend_pb2.ChatMessage(role="bot", content="x")]
                ),
                "messages[0].role",
            ),
            (
                frontend_pb2.ChatRequest(
                    messages=[frontend_pb2.ChatMessage(role="user", content="x")],
                    sampling_params=common_pb2.SamplingParams(top_p=-1),
                ),
                "sampling_params.top_p",
            ),
            (
                frontend_pb2.ChatRequest(
                    messages=[frontend_pb2.ChatMessage(role="user", content="x")],
                    stream_interval=1000,
                ),
                "stream_interval",
            ),
            (
                frontend_pb2.ChatRequest(
                    messages=[frontend_pb2.ChatMessage(role="user", content="x")],
                    sampling_params=common_pb2.SamplingParams(detokenize=False),
                ),
                "sampling_params.detokenize",  # a Chat reply is text
            ),
        ]
        for request, field in bad_chats:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await _collect(h.stub.Chat(request))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert exc.value.details().startswith(field + ":"), exc.value.details()
        assert h.fake.requests == []  # nothing invalid reached the worker
        # and the frontend still serves
        assert (await _collect(h.stub.Generate(_generate(prompt="ok"))))[-1].finish_reason

    run(
        test,
        tokenizer,
        tiny_model_dir,
        max_stop_strings=2,
        max_stop_string_length=8,
        max_prompt_bytes=1000,
    )


def test_admission_control(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.hang_after = 1
        calls = [h.stub.Generate(_generate(prompt="x")) for _ in range(2)]
        for call in calls:
            await call.read()  # admitted and streaming
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        calls[0].cancel()
        deadline = time.monotonic() + 2
        while h.frontend.servicer.num_in_flight > 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        h.fake.hang_after = None
        assert (await _collect(h.stub.Generate(_generate(prompt="x"))))[-1].finish_reason
        calls[1].cancel()

    run(test, tokenizer, tiny_model_dir, max_concurrent_requests=2)


def test_client_cancel_cancels_worker_call(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.hang_after = 1
        call = h.stub.Generate(_generate(prompt="x"))
        assert (await call.read()).token_ids
        assert not h.fake.cancelled.is_set()
        call.cancel()
        await asyncio.wait_for(h.fake.cancelled.wait(), 2)

    run(test, tokenizer, tiny_model_dir)


def test_deadline_forwarded(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await _collect(h.stub.Generate(_generate(prompt="x"), timeout=5))
        await _collect(h.stub.Generate(_generate(prompt="x")))
        with_deadline, without = h.fake.time_remaining
        assert 3 < with_deadline < 5.1  # (gRPC rounds deadlines up a little)
        assert 40 < without < 42.1  # the frontend's request_timeout_s
        h.fake.hang_after = 1
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x"), timeout=0.5))
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 2
        await asyncio.wait_for(h.fake.cancelled.wait(), 2)

    run(test, tokenizer, tiny_model_dir, request_timeout_s=42)
