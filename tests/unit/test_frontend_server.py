"""FrontendServicer against an in-process fake WorkerService on 127.0.0.1:0: streaming, stop
strings, validation, admission, cancellation, deadlines, worker loss, health."""

import asyncio
import contextlib
import json
import math
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.server import FrontendServer
from nanoserve.frontend.tokenizer import Tokenizer
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.tiny.tokenizer import CHAT_TEMPLATE

OUTPUT = "Hello, 世界! 😀 The end. STOP after"
MAX_MODEL_LEN = 64
VOCAB_SIZE = 151936
IM_END_ID = 151645


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    tok = Tokenizer(tiny_model_dir)
    yield tok
    tok.close()


class FakeWorker(worker_grpc.WorkerServiceServicer):
    """Streams the ids of OUTPUT two at a time; records what the frontend sent and whether the
    call was cancelled."""

    def __init__(self, tokenizer: Tokenizer, digest: str) -> None:
        self.output_ids = tokenizer.encode(OUTPUT, add_special_tokens=False)
        self.info = worker_pb2.WorkerServiceGetModelInfoResponse(
            model_name="fake",
            max_model_len=MAX_MODEL_LEN,
            vocab_size=VOCAB_SIZE,
            eos_token_ids=[IM_END_ID],
            tensor_parallel_size=1,
            tokenizer_digest=digest,
        )
        self.requests: list[worker_pb2.GenerateTokensRequest] = []
        self.time_remaining: list[float | None] = []
        self.cancelled = asyncio.Event()
        self.hang_after: int | None = None  # chunks sent before waiting forever
        self.stop_token_id: int | None = None  # appended as the last id, reported as stop_token_id
        self.logprobs = False  # attach a TokenLogprobs to each id and prompt position 1..

    async def GenerateTokens(self, request, context) -> AsyncIterator:
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        ids = self.output_ids + ([self.stop_token_id] if self.stop_token_id is not None else [])
        try:
            for n, start in enumerate(range(0, len(ids), 2)):
                if n == self.hang_after:
                    await asyncio.Event().wait()
                chunk = worker_pb2.GenerateTokensResponse(token_ids=ids[start : start + 2])
                if self.logprobs:
                    chunk.logprobs.extend(_fake_entry(i) for i in chunk.token_ids)
                    if start == 0:
                        prompt = request.prompt_token_ids[1:]
                        chunk.prompt_logprobs.extend(_fake_entry(i) for i in prompt)
                if start + 2 >= len(ids):
                    chunk.finish_reason = (
                        common_pb2.FINISH_REASON_STOP
                        if self.stop_token_id is not None
                        else common_pb2.FINISH_REASON_LENGTH
                    )
                    chunk.usage.CopyFrom(
                        common_pb2.Usage(
                            prompt_tokens=len(request.prompt_token_ids),
                            completion_tokens=len(ids),
                            cached_tokens=3,
                        )
                    )
                    if self.stop_token_id is not None:
                        chunk.stop_token_id = self.stop_token_id
                yield chunk
                await asyncio.sleep(0.001)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def Session(self, request_iterator, context) -> AsyncIterator:
        """Runs GenerateTokens for each add on its own task (an abort cancels it and counts as
        `cancelled`); one response per chunk. The add's timeout_s is what GenerateTokens sees as its time remaining."""
        outputs: asyncio.Queue = asyncio.Queue()
        tasks: dict[str, asyncio.Task] = {}

        async def run(add: worker_pb2.SessionAdd) -> None:
            timeout = _Remaining(add.timeout_s or None)
            async for chunk in self.GenerateTokens(add.request, timeout):
                out = worker_pb2.SessionOutput(
                    request_id=add.request.request_id,
                    token_ids=chunk.token_ids,
                    finish_reason=chunk.finish_reason,
                )
                out.logprobs.extend(chunk.logprobs)
                out.prompt_logprobs.extend(chunk.prompt_logprobs)
                if chunk.HasField("usage"):
                    out.usage.CopyFrom(chunk.usage)
                if chunk.HasField("stop_token_id"):
                    out.stop_token_id = chunk.stop_token_id
                outputs.put_nowait(out)

        async def read() -> None:
            async for message in request_iterator:
                for request_id in message.aborts:  # the frontend ends a request it still runs
                    tasks.pop(request_id).cancel()
                    self.cancelled.set()
                for add in message.adds:
                    tasks[add.request.request_id] = asyncio.create_task(run(add))

        reader = asyncio.create_task(read())
        try:
            while True:
                yield worker_pb2.SessionResponse(outputs=[await outputs.get()])
        finally:
            reader.cancel()
            for task in tasks.values():
                task.cancel()

    async def GetModelInfo(self, request, context):
        return self.info

    async def GetLoad(self, request, context):
        return worker_pb2.GetLoadResponse(num_free_blocks=64, num_total_blocks=64)


@dataclass
class _Remaining:
    """The part of a servicer context that FakeWorker.GenerateTokens reads."""

    seconds: float | None

    def time_remaining(self) -> float | None:
        return self.seconds


@dataclass
class Harness:
    fake: FakeWorker
    frontend: FrontendServer
    stub: frontend_grpc.FrontendServiceStub
    health: health_pb2_grpc.HealthStub
    worker_server: grpc.aio.Server


async def _start_worker(fake: FakeWorker, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    worker_grpc.add_WorkerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


async def _health(harness: Harness, service: str = "") -> int:
    return (await harness.health.Check(health_pb2.HealthCheckRequest(service=service))).status


async def _wait_health(harness: Harness, status: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while await _health(harness) != status:
        assert time.monotonic() < deadline, "frontend health never changed"
        await asyncio.sleep(0.02)


def _fake_entry(token_id: int) -> common_pb2.TokenLogprobs:
    """A logprob entry naming its token (its logprob, -token_id / 1e6, tells entries apart)."""
    logprob = -token_id / 1e6
    top = common_pb2.TokenLogprob(token_id=token_id, logprob=logprob)
    return common_pb2.TokenLogprobs(token_id=token_id, logprob=logprob, rank=1, top_logprobs=[top])


@contextlib.asynccontextmanager
async def services(
    tokenizer: Tokenizer, model_dir: Path, digest: str | None = None, wait: bool = True, **config
) -> AsyncIterator[Harness]:
    fake = FakeWorker(tokenizer, tokenizer_digest(model_dir) if digest is None else digest)
    worker_server, worker_port = await _start_worker(fake)
    frontend_config = FrontendConfig(
        model=str(model_dir), port=0, worker_address=f"127.0.0.1:{worker_port}", **config
    )
    frontend = FrontendServer(frontend_config, str(model_dir), tokenizer=tokenizer)
    port = await frontend.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    harness = Harness(
        fake,
        frontend,
        frontend_grpc.FrontendServiceStub(channel),
        health_pb2_grpc.HealthStub(channel),
        worker_server,
    )
    try:
        if wait:
            await _wait_health(harness, health_pb2.HealthCheckResponse.SERVING)
        yield harness
    finally:
        await channel.close()
        await frontend.stop(0)
        await harness.worker_server.stop(0)  # the test may have replaced it


def run(test: Callable, tokenizer: Tokenizer, model_dir: Path, **kwargs) -> None:
    async def main() -> None:
        async with services(tokenizer, model_dir, **kwargs) as harness:
            await test(harness)

    asyncio.run(asyncio.wait_for(main(), 30))


async def _collect(call) -> list:
    return [response async for response in call]


async def _read_rest(call) -> list:
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    return responses


def _generate(**fields) -> frontend_pb2.GenerateRequest:
    params = fields.pop("sampling_params", {})
    return frontend_pb2.GenerateRequest(
        sampling_params=common_pb2.SamplingParams(**params), **fields
    )


def test_generate_streams_text_and_usage(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        responses = await _collect(
            h.stub.Generate(
                _generate(
                    prompt="Say hi",
                    sampling_params={"max_tokens": 20, "temperature": 0.0, "seed": 7},
                )
            )
        )
        assert "".join(r.text for r in responses) == OUTPUT
        assert [i for r in responses for i in r.token_ids] == h.fake.output_ids
        last = responses[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert all(r.finish_reason == 0 for r in responses[:-1])
        assert (last.usage.prompt_tokens, last.usage.cached_tokens) == (2, 3)
        sent = h.fake.requests[0]
        assert list(sent.prompt_token_ids) == tokenizer.encode("Say hi")
        assert sent.request_id and sent.sampling_params.max_tokens == 20
        assert sent.sampling_params.seed == 7 and sent.sampling_params.HasField("temperature")
        assert h.frontend.servicer.num_in_flight == 0

    run(test, tokenizer, tiny_model_dir)


def test_unset_max_tokens_fills_the_context(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await _collect(h.stub.Generate(_generate(prompt_token_ids=[1, 2, 3])))
        params = h.fake.requests[0].sampling_params
        assert params.max_tokens == MAX_MODEL_LEN - 3 and not params.stop

    run(test, tokenizer, tiny_model_dir)


def test_stop_string_ends_the_worker_call(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.hang_after = 100  # only a stop string can end this request early
        responses = await _collect(
            h.stub.Generate(_generate(prompt="x", sampling_params={"stop": ["end. S", "never"]}))
        )
        assert "".join(r.text for r in responses) == "Hello, 世界! 😀 The "
        last = responses[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_STOP
        assert last.matched_stop == "end. S"
        sent_ids = [i for r in responses for i in r.token_ids]
        assert sent_ids == h.fake.output_ids[: len(sent_ids)]
        assert last.usage.completion_tokens == len(sent_ids) < len(h.fake.output_ids)
        await asyncio.wait_for(h.fake.cancelled.wait(), 2)

    run(test, tokenizer, tiny_model_dir)


def test_stop_token_text_excluded_unless_asked(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.stop_token_id = tokenizer.encode("!", add_special_tokens=False)[0]
        responses = await _collect(h.stub.Generate(_generate(prompt="x")))
        assert "".join(r.text for r in responses) == OUTPUT
        assert responses[-1].matched_stop_token_id == h.fake.stop_token_id
        assert responses[-1].token_ids[-1] == h.fake.stop_token_id
        responses = await _collect(
            h.stub.Generate(
                _generate(prompt="x", sampling_params={"include_stop_str_in_output": True})
            )
        )
        assert "".join(r.text for r in responses) == OUTPUT + "!"

    run(test, tokenizer, tiny_model_dir)


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


def test_worker_down_is_unavailable_fast(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await h.worker_server.stop(0)
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < 1
        await _wait_health(h, health_pb2.HealthCheckResponse.NOT_SERVING)
        # A worker back on the same port is found again and the model info re-fetched.
        port = int(h.frontend.config.worker_address.rsplit(":", 1)[1])
        h.fake.info.max_model_len = 48
        h.worker_server, _ = await _start_worker(h.fake, port)
        await _wait_health(h, health_pb2.HealthCheckResponse.SERVING)
        info = await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert info.max_model_len == 48

    run(test, tokenizer, tiny_model_dir)


def test_no_worker_not_serving(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await h.worker_server.stop(0)
        await _wait_health(h, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert (
            await _health(h, "nanoserve.v1.FrontendService")
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        # Tokenize needs only the local tokenizer
        response = await h.stub.Tokenize(frontend_pb2.TokenizeRequest(text="hi 世界"))
        assert list(response.token_ids) == tokenizer.encode("hi 世界")

    run(test, tokenizer, tiny_model_dir)


def test_tokenizer_digest_mismatch_refuses(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await asyncio.sleep(0.3)
        assert await _health(h) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "tokenizer" in exc.value.details()

    run(test, tokenizer, tiny_model_dir, digest="0" * 64, wait=False)


def test_chat_model_info_tokenize(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        messages = [
            frontend_pb2.ChatMessage(role="system", content="Be brief."),
            frontend_pb2.ChatMessage(role="user", content="Hi"),
        ]
        responses = await _collect(
            h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, enable_thinking=False))
        )
        assert isinstance(responses[-1], frontend_pb2.ChatResponse)
        assert "".join(r.text for r in responses) == OUTPUT
        expected = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], enable_thinking=False
        )
        assert "<think>" in expected and expected.endswith("</think>\n\n")
        assert list(h.fake.requests[0].prompt_token_ids) == tokenizer.encode(expected, False)
        info = await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert (info.model_name, info.max_model_len, info.vocab_size) == (
            "fake",
            MAX_MODEL_LEN,
            VOCAB_SIZE,
        )
        assert list(info.eos_token_ids) == [IM_END_ID] and info.has_chat_template
        response = await h.stub.Tokenize(frontend_pb2.TokenizeRequest(text="<|im_end|>"))
        assert list(response.token_ids) == [IM_END_ID]

    run(test, tokenizer, tiny_model_dir)


def test_graceful_stop_lets_streams_finish(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        watch = h.health.Watch(
            health_pb2.HealthCheckRequest(service="nanoserve.v1.FrontendService")
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        call = h.stub.Generate(_generate(prompt="x"))
        await call.read()
        stopping = asyncio.create_task(h.frontend.stop(5))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await _health(h) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as exc:  # new calls are refused while draining
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        rest = await _read_rest(call)  # the call in flight finishes
        assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        await asyncio.wait_for(stopping, 2)  # without waiting out the grace period

    run(test, tokenizer, tiny_model_dir)


def test_reflection_lists_the_services(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def test(h: Harness) -> None:
        port = h.frontend.port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            response = await call.read()
            await call.done_writing()
        names = {s.name for s in response.list_services_response.service}
        assert {"nanoserve.v1.FrontendService", "grpc.health.v1.Health"} <= names

    run(test, tokenizer, tiny_model_dir)


def test_broken_session_ends_every_stream_unavailable(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    """All requests share one Session stream to the worker; when it breaks, each ends UNAVAILABLE
    and the next request opens a new session."""

    async def test(h: Harness) -> None:
        h.fake.hang_after = 1
        calls = [h.stub.Generate(_generate(prompt="x", request_id=f"c{i}")) for i in range(3)]
        for call in calls:
            assert (await call.read()).token_ids
        # the worker sees the client's id (for its logs) made unique by the frontend
        assert sorted(r.request_id.partition("#")[0] for r in h.fake.requests) == ["c0", "c1", "c2"]
        assert all(
            re.fullmatch(r"[0-9a-f]{8}-\d+", r.request_id.partition("#")[2])
            for r in h.fake.requests
        )
        await h.worker_server.stop(0)
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        port = int(h.frontend.config.worker_address.rsplit(":", 1)[1])
        h.fake.hang_after = None
        h.worker_server, _ = await _start_worker(h.fake, port)
        await _wait_health(h, health_pb2.HealthCheckResponse.SERVING)
        responses = await _collect(h.stub.Generate(_generate(prompt="again")))
        assert "".join(r.text for r in responses) == OUTPUT

    run(test, tokenizer, tiny_model_dir)


def test_stream_interval_coalesces_after_the_first_token(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    async def test(h: Harness) -> None:
        responses = await _collect(h.stub.Generate(_generate(prompt="x")))
        sizes = [len(r.token_ids) for r in responses]
        assert sizes[0] == 2  # the first message goes out at once (the fake sends 2 ids a time)
        assert all(size >= 6 for size in sizes[1:-1]), sizes
        assert sum(sizes) == len(h.fake.output_ids)
        assert "".join(r.text for r in responses) == OUTPUT

    run(test, tokenizer, tiny_model_dir, stream_interval=6)


RECORDED_TOOL_REPLY = (  # a Qwen3 reply: reasoning, a sentence, two calls (the worker sends ids)
    "<think>\nThe user wants the weather in two cities.\n</think>\n\nLet me check both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>'
)


def test_chat_tools_and_reasoning(
    tokenizer: Tokenizer, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the servicer: tools reach the prompt, the reply's ids (streamed two at a time) come
    back split into reasoning_content, text and structured tool_calls; finish_reason TOOL_CALLS.
    With parallel_tool_calls false, only the first call."""
    monkeypatch.setitem(globals(), "MAX_MODEL_LEN", 4096)  # room for the tools' prompt
    tool = frontend_pb2.Tool(
        type="function",
        function=frontend_pb2.ToolFunction(
            name="get_weather", parameters='{"type": "object", "properties": {}}'
        ),
    )
    messages = [frontend_pb2.ChatMessage(role="user", content="Weather in Paris and Tokyo?")]

    async def test(h: Harness) -> None:
        h.fake.output_ids = tokenizer.encode(RECORDED_TOOL_REPLY, add_special_tokens=False)
        h.fake.stop_token_id = IM_END_ID
        request = frontend_pb2.ChatRequest(messages=messages, tools=[tool], separate_reasoning=True)
        responses = await _collect(h.stub.Chat(request))
        assert len(responses) > 5  # streamed
        assert "".join(r.reasoning_content for r in responses) == (
            "The user wants the weather in two cities."
        )
        assert "".join(r.text for r in responses) == "Let me check both."
        calls = [c for r in responses for c in r.tool_calls]
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("get_weather", '{"city": "Paris"}'),
            ("get_weather", '{"city": "東京"}'),
        ]
        assert len({c.id for c in calls}) == 2 and all(c.type == "function" for c in calls)
        assert sum(bool(r.tool_calls) for r in responses) == 2  # each sent once, when complete
        assert not any(r.tool_call_parse_error for r in responses)
        assert responses[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": messages[0].content}],
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ],
        )
        assert "<tools>" in expected
        assert list(h.fake.requests[-1].prompt_token_ids) == tokenizer.encode(expected, False)

        # parallel_tool_calls false ("auto"): the first call only, the second never sent
        request.parallel_tool_calls = False
        single = await _collect(h.stub.Chat(request))
        assert "".join(r.text for r in single) == "Let me check both."
        calls = [c for r in single for c in r.tool_calls]
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("get_weather", '{"city": "Paris"}')
        ]
        assert single[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS

        # tool_choice "none": no tools in the prompt, the reply's text untouched
        plain = await _collect(
            h.stub.Chat(
                frontend_pb2.ChatRequest(messages=messages, tools=[tool], tool_choice="none")
            )
        )
        assert "".join(r.text for r in plain) == RECORDED_TOOL_REPLY
        assert not any(r.tool_calls or r.reasoning_content for r in plain)
        assert plain[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        bare = tokenizer.apply_chat_template([{"role": "user", "content": messages[0].content}])
        assert list(h.fake.requests[-1].prompt_token_ids) == tokenizer.encode(bare, False)

        # a malformed block stays text, flagged
        h.fake.output_ids = tokenizer.encode('<tool_call>\n{"name": oops}\n</tool_call>', False)
        bad = await _collect(h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, tools=[tool])))
        assert "".join(r.text for r in bad) == '<tool_call>\n{"name": oops}\n</tool_call>'
        assert any(r.tool_call_parse_error for r in bad) and not any(r.tool_calls for r in bad)
        assert bad[-1].finish_reason == common_pb2.FINISH_REASON_STOP

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _collect(
                h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, tool_choice="any"))
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tool_choice" in e.value.details()

    run(test, tokenizer, tiny_model_dir)


def test_chat_reasoning_opened_by_the_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A template that opens the think block in the prompt (as Qwen3's thinking-only models do):
    the reply has no opening tag and starts as reasoning; cut by max_tokens before </think>, all
    of it is reasoning."""
    opened = CHAT_TEMPLATE.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    )
    assert opened != CHAT_TEMPLATE
    shutil.copyfile(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": opened}))
    tokenizer = Tokenizer(tmp_path)
    messages = [frontend_pb2.ChatMessage(role="user", content="2+2?")]

    async def test(h: Harness) -> None:
        h.fake.output_ids = tokenizer.encode("Add them.\n</think>\n\n4", False)
        h.fake.stop_token_id = IM_END_ID
        request = frontend_pb2.ChatRequest(messages=messages, separate_reasoning=True)
        done = await _collect(h.stub.Chat(request))
        assert "".join(r.reasoning_content for r in done) == "Add them."
        assert "".join(r.text for r in done) == "4"
        assert done[-1].finish_reason == common_pb2.FINISH_REASON_STOP

        h.fake.output_ids = tokenizer.encode("Add them, then", False)
        h.fake.stop_token_id = None
        cut = await _collect(h.stub.Chat(request))
        assert "".join(r.reasoning_content for r in cut) == "Add them, then"
        assert "".join(r.text for r in cut) == ""
        assert cut[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

        plain = await _collect(h.stub.Chat(frontend_pb2.ChatRequest(messages=messages)))
        assert "".join(r.text for r in plain) == "Add them, then"  # off: text unchanged

    try:
        run(test, tokenizer, tmp_path)
    finally:
        tokenizer.close()


@pytest.mark.parametrize("stop", [None, "STOP"])
def test_logprobs_split_across_bounded_messages(
    tokenizer: Tokenizer, tiny_model_dir: Path, stop: str | None
) -> None:
    """Prompt entries go first in messages of at most max_logprobs_per_message entries, then ids
    with one entry each (a backlog of ids is split too: stream_interval lets them pile up)."""
    prompt = "one two three four five six seven eight nine ten"
    prompt_ids = tokenizer.encode(prompt)

    async def test(h: Harness) -> None:
        h.fake.logprobs = True
        params = {"logprobs": 1, "prompt_logprobs": 1, "stop": [stop] if stop else []}
        call = h.stub.Generate(_generate(prompt=prompt, sampling_params=params))
        responses = await _collect(call)
        for r in responses:
            assert len(r.logprobs) + len(r.prompt_logprobs) <= 3, r
            assert len(r.logprobs) == len(r.token_ids)  # one entry per id
            assert [e.token_id for e in r.logprobs] == list(r.token_ids)
            assert all(e.text == tokenizer.token_texts([e.token_id])[0] for e in r.logprobs)
        prompt_messages = [r for r in responses if r.prompt_logprobs]
        assert all(not r.token_ids and not r.text for r in prompt_messages[:-1])
        joined = [e.token_id for r in responses for e in r.prompt_logprobs]
        assert joined == prompt_ids[1:]
        text = "".join(r.text for r in responses)
        ids = [i for r in responses for i in r.token_ids]
        expected = OUTPUT[: OUTPUT.index(stop)] if stop else OUTPUT
        assert text == expected
        assert max(len(r.token_ids) for r in responses) == 3  # the backlog of 8 ids was split
        assert [e.token_id for r in responses for e in r.logprobs] == ids
        assert responses[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
        if stop is None:
            assert ids == h.fake.output_ids

    run(test, tokenizer, tiny_model_dir, max_logprobs_per_message=3, stream_interval=8)
