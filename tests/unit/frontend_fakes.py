"""A fake WorkerService for FrontendServer tests (it streams OUTPUT's ids, records what it was sent)
and the harness that runs a real FrontendServer in front of it on 127.0.0.1:0."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.server import FrontendServer
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.text.tokenizer import Tokenizer

OUTPUT = "Hello, 世界! 😀 The end. STOP after"
MAX_MODEL_LEN = 64
VOCAB_SIZE = 151936
IM_END_ID = 151645


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
        self.chunk_delay_s = 0.001  # the pause after each chunk (a slower worker: longer streams)

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
                await asyncio.sleep(self.chunk_delay_s)
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
