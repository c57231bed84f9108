"""Invalid requests against the real frontend and, as a trust boundary of its own, the worker: each
gets INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for an oversized message) naming the field, and the
services keep serving with every KV block free. Admission control refuses the request past the limit.
"""

import asyncio
import math
import time
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import AsyncClient, Client
from nanoserve.errors import AlreadyExists, ResourceExhausted
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.conftest import Service, assert_idle, start_frontend

pytestmark = pytest.mark.e2e

VOCAB = 151936
MAX_MODEL_LEN = 4096
MiB = 1024 * 1024
SP = common_pb2.SamplingParams
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def generate(prompt: str = "hello", ids: list[int] | None = None, **sampling) -> tuple:
    return (
        "Generate",
        frontend_pb2.GenerateRequest(
            prompt=prompt, prompt_token_ids=ids or [], sampling_params=SP(**sampling)
        ),
    )


def chat(messages: list[tuple[str, str]], **sampling) -> tuple:
    request = frontend_pb2.ChatRequest(sampling_params=SP(**sampling))
    for role, content in messages:
        request.messages.add(role=role, content=content)
    return ("Chat", request)


# (case id, (method, request) or a function making it, expected code, text the details hold)
FRONTEND_CASES = [
    ("empty prompt", generate(""), INVALID, "prompt"),
    ("both prompt and ids", generate("hi", [1, 2]), INVALID, "prompt"),
    ("id out of range", generate("", [1, VOCAB]), INVALID, "prompt_token_ids[1]"),
    ("id uint32 max", generate("", [2**32 - 1]), INVALID, "prompt_token_ids[0]"),
    ("negative temperature", generate(temperature=-0.5), INVALID, "sampling_params.temperature"),
    ("nan temperature", generate(temperature=math.nan), INVALID, "sampling_params.temperature"),
    ("inf top_p", generate(top_p=math.inf), INVALID, "sampling_params.top_p"),
    ("top_p 0", generate(top_p=0.0), INVALID, "sampling_params.top_p"),
    ("negative top_k", generate(top_k=-2), INVALID, "sampling_params.top_k"),
    ("min_p above 1", generate(min_p=1.5), INVALID, "sampling_params.min_p"),
    ("nan min_p", generate(min_p=math.nan), INVALID, "sampling_params.min_p"),
    (
        "repetition_penalty 0",
        generate(repetition_penalty=0.0),
        INVALID,
        "sampling_params.repetition_penalty",
    ),
    (
        "-inf presence_penalty",
        generate(presence_penalty=-math.inf),
        INVALID,
        "sampling_params.presence_penalty",
    ),
    (
        "frequency_penalty 3",
        generate(frequency_penalty=3.0),
        INVALID,
        "sampling_params.frequency_penalty",
    ),
    ("max_tokens 0", generate(max_tokens=0), INVALID, "sampling_params.max_tokens"),
    ("negative max_tokens", generate(max_tokens=-1), INVALID, "sampling_params.max_tokens"),
    (
        "max_tokens past the context",
        generate(max_tokens=MAX_MODEL_LEN),
        INVALID,
        "sampling_params.max_tokens",
    ),
    (
        "min_tokens > max_tokens",
        generate(max_tokens=4, min_tokens=5),
        INVALID,
        "sampling_params.min_tokens",
    ),
    (
        "min_tokens past the context",
        generate(min_tokens=MAX_MODEL_LEN),
        INVALID,
        "sampling_params.min_tokens",
    ),
    ("negative min_tokens", generate(min_tokens=-1), INVALID, "sampling_params.min_tokens"),
    ("too many stop strings", generate(stop=["x"] * 17), INVALID, "sampling_params.stop"),
    ("too long stop string", generate(stop=["ok", "x" * 257]), INVALID, "sampling_params.stop[1]"),
    ("empty stop string", generate(stop=[""]), INVALID, "sampling_params.stop[0]"),
    (
        "stop token id out of range",
        generate(stop_token_ids=[VOCAB]),
        INVALID,
        "sampling_params.stop_token_ids[0]",
    ),
    (
        "prompt over max_prompt_bytes",
        lambda: generate("x" * (5 * MiB)),
        INVALID,
        "max_prompt_bytes",
    ),
    ("prompt fills the context", generate("hello " * 5000), INVALID, "prompt"),
    (
        "request_id too long",
        ("Generate", frontend_pb2.GenerateRequest(prompt="hi", request_id="r" * 200)),
        INVALID,
        "request_id",
    ),
    (
        "request_id not printable",
        ("Generate", frontend_pb2.GenerateRequest(prompt="hi", request_id="a\nb")),
        INVALID,
        "request_id",
    ),
    ("no chat messages", chat([]), INVALID, "messages"),
    ("unknown chat role", chat([("robot", "hi")]), INVALID, "messages[0].role"),
    (
        "chat nan temperature",
        chat([("user", "hi")], temperature=math.nan),
        INVALID,
        "sampling_params.temperature",
    ),
    # past the server's 16 MiB message limit: refused by gRPC itself before any handler runs
    (
        "message over 16 MiB",
        lambda: generate("x" * (17 * MiB)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    (
        "huge stop list",
        lambda: generate(stop=["x" * 100_000] * 200),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
]


def worker_request(ids: list[int], request_id: str = "", **sampling):
    return worker_pb2.GenerateTokensRequest(
        request_id=request_id, prompt_token_ids=ids, sampling_params=SP(**sampling)
    )


WORKER_CASES = [
    ("empty prompt", worker_request([]), INVALID, "prompt_token_ids"),
    ("id = vocab", worker_request([1, VOCAB]), INVALID, "prompt_token_ids"),
    ("id uint32 max", worker_request([2**32 - 1]), INVALID, "prompt_token_ids"),
    ("prompt = max_model_len", worker_request([1] * MAX_MODEL_LEN), INVALID, "prompt_token_ids"),
    (
        "prompt past max_model_len",
        lambda: worker_request([1] * 10_000),
        INVALID,
        "prompt_token_ids",
    ),
    (
        "max_tokens past the context",
        worker_request([1] * 4000, max_tokens=100),
        INVALID,
        "max_tokens",
    ),
    ("max_tokens 0", worker_request([1], max_tokens=0), INVALID, "max_tokens"),
    ("nan temperature", worker_request([1], temperature=math.nan), INVALID, "temperature"),
    (
        "inf repetition_penalty",
        worker_request([1], repetition_penalty=math.inf),
        INVALID,
        "repetition_penalty",
    ),
    ("top_p 0", worker_request([1], top_p=0.0), INVALID, "top_p"),
    ("negative top_k", worker_request([1], top_k=-5), INVALID, "top_k"),
    (
        "min_tokens > max_tokens",
        worker_request([1], max_tokens=2, min_tokens=3),
        INVALID,
        "min_tokens",
    ),
    (
        "stop token id = vocab",
        worker_request([1], stop_token_ids=[VOCAB]),
        INVALID,
        "stop_token_ids",
    ),
    (
        "message over 16 MiB",
        lambda: worker_request([VOCAB - 1] * (6 * MiB)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
]

# raw channels that can send past the servers' receive limit, to see what the servers do
UNLIMITED = [("grpc.max_send_message_length", -1)]


@pytest.fixture(scope="module")
def frontend_stub(services) -> Iterator[frontend_grpc.FrontendServiceStub]:
    with grpc.insecure_channel(services.frontend.address, options=UNLIMITED) as channel:
        yield frontend_grpc.FrontendServiceStub(channel)


@pytest.fixture(scope="module")
def worker_stub(services) -> Iterator[worker_grpc.WorkerServiceStub]:
    with grpc.insecure_channel(services.worker.address, options=UNLIMITED) as channel:
        yield worker_grpc.WorkerServiceStub(channel)


def status_of(call) -> tuple[grpc.StatusCode, str, int]:
    """Consumes a response stream: (code, details, messages received before it ended)."""
    received = 0
    try:
        for _ in call:
            received += 1
    except grpc.RpcError as e:
        return e.code(), e.details() or "", received
    return grpc.StatusCode.OK, "", received


@pytest.mark.parametrize(
    ("request_case", "code", "field"),
    [case[1:] for case in FRONTEND_CASES],
    ids=[case[0] for case in FRONTEND_CASES],
)
def test_frontend_rejects(frontend_stub, request_case, code, field) -> None:
    method, request = request_case() if callable(request_case) else request_case
    got, details, received = status_of(getattr(frontend_stub, method)(request, timeout=30))
    assert (got, received) == (code, 0), details
    assert field in details


@pytest.mark.parametrize(
    ("worker_case", "code", "field"),
    [case[1:] for case in WORKER_CASES],
    ids=[case[0] for case in WORKER_CASES],
)
def test_worker_rejects(worker_stub, worker_case, code, field) -> None:
    request = worker_case() if callable(worker_case) else worker_case
    got, details, received = status_of(worker_stub.GenerateTokens(request, timeout=30))
    assert (got, received) == (code, 0), details
    assert field in details


def test_worker_rejects_a_duplicate_request_id(worker_stub) -> None:
    first = worker_stub.GenerateTokens(
        worker_request([1, 2, 3], "dup", max_tokens=2000), timeout=30
    )
    next(first)  # running now
    got, details, _ = status_of(worker_stub.GenerateTokens(worker_request([4], "dup"), timeout=30))
    assert got == INVALID and "request_id" in details
    first.cancel()


def test_frontend_refuses_a_request_id_in_flight(services) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        stream = client.generate_stream("Tell me a story", request_id="same-id", max_tokens=3000)
        next(stream)
        with pytest.raises(AlreadyExists, match="same-id"):
            client.generate("hello", request_id="same-id", max_tokens=2)
        stream.close()  # cancels the call; the id is free again once the frontend sees that
        for _ in range(40):
            try:
                done = client.generate("hello", request_id="same-id", max_tokens=2)
                break
            except AlreadyExists:
                time.sleep(0.05)
    assert done.finish_reason == "length"


def test_worker_request_id_reused_after_cancel_gets_only_its_own_tokens(worker_stub) -> None:
    """A step of the aborted request still in flight must not reach the new stream of the same id
    (regression: the worker once routed deltas by the client's request_id)."""
    want = [
        t
        for r in worker_stub.GenerateTokens(
            worker_request([9707, 1879], max_tokens=2, temperature=0), timeout=30
        )
        for t in r.token_ids
    ]
    got = []
    for _ in range(5):  # the old request is mid-step when it is cancelled: every try hits it
        old = worker_stub.GenerateTokens(
            worker_request([785, 6722, 315], "reused", max_tokens=3000), timeout=30
        )
        next(old)
        old.cancel()
        new = worker_stub.GenerateTokens(
            worker_request([9707, 1879], "reused", max_tokens=2, temperature=0), timeout=30
        )
        got.append([t for r in new for t in r.token_ids])
    assert got == [want] * 5


def test_frontend_request_id_reused_after_cancel_gets_only_its_own_tokens(services) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        want = client.generate("hello", temperature=0, max_tokens=2)
        got = []
        for _ in range(5):
            old = client.generate_stream("Tell me a story", request_id="reused", max_tokens=3000)
            next(old)
            old.close()
            for _ in range(40):  # until the frontend has released the id
                try:
                    got.append(
                        client.generate(
                            "hello", request_id="reused", temperature=0, max_tokens=2
                        ).token_ids
                    )
                    break
                except AlreadyExists:
                    time.sleep(0.02)
    assert got == [want.token_ids] * 5


def test_frontend_names_prompt_token_ids_when_they_fill_the_context(frontend_stub) -> None:
    _, request = generate("", [1] * MAX_MODEL_LEN)
    got, details, _ = status_of(frontend_stub.Generate(request, timeout=30))
    assert got == INVALID
    assert details.startswith("prompt_token_ids")


def test_still_serving_after_bad_inputs(services, frontend_stub, worker_stub) -> None:
    """Runs last in this module: the services answer normally and every block is free."""
    with Client(services.frontend.address, timeout=30) as client:
        completion = client.generate("The capital of France is", temperature=0, max_tokens=8)
    assert completion.finish_reason == "length" and len(completion.token_ids) == 8
    responses = list(
        worker_stub.GenerateTokens(worker_request([1, 2, 3], max_tokens=4), timeout=30)
    )
    assert sum(len(r.token_ids) for r in responses) == 4
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert_idle(services.worker.address)


@pytest.fixture(scope="module")
def admission_frontend(services, tiny_model_dir) -> Iterator[Service]:
    frontend = start_frontend(
        tiny_model_dir, services.worker.address, "--max-concurrent-requests", "2"
    )
    yield frontend
    frontend.stop()


def test_admission_control_refuses_the_third_stream(services, admission_frontend) -> None:
    async def main() -> None:
        async with AsyncClient(admission_frontend.address, timeout=30) as client:
            streams = [
                client.generate_stream("Tell me a long story", max_tokens=3000) for _ in range(2)
            ]
            for s in streams:
                await anext(s)  # both admitted and running
            with pytest.raises(ResourceExhausted, match="max_concurrent_requests"):
                await client.generate("one too many", max_tokens=4)
            for s in streams:
                await s.aclose()
            # the slots are given back once the streams are cancelled
            for _ in range(50):
                try:
                    done = await client.generate("now there is room", max_tokens=4)
                    break
                except ResourceExhausted:
                    await asyncio.sleep(0.05)
            assert len(done.token_ids) == 4

    asyncio.run(main())
    assert_idle(services.worker.address)


def test_worker_admission_refuses_past_max_queued_requests(tiny_model_dir) -> None:
    """The worker's own limit (a frontend is not its only client): RESOURCE_EXHAUSTED, then room."""
    from tests.e2e.conftest import start_worker

    worker = start_worker(tiny_model_dir, "--max-queued-requests", "2")
    try:

        async def main() -> None:
            async with grpc.aio.insecure_channel(worker.address) as channel:
                stub = worker_grpc.WorkerServiceStub(channel)
                calls = [
                    stub.GenerateTokens(worker_request([5, 6, 7], max_tokens=3000), timeout=60)
                    for _ in range(2)
                ]
                for call in calls:
                    await call.read()  # both running
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    extra = stub.GenerateTokens(worker_request([5], max_tokens=4), timeout=60)
                    async for _ in extra:
                        pass
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_queued_requests" in refused.value.details()
                for call in calls:
                    call.cancel()
                for _ in range(100):  # the cancelled streams give their places back
                    try:
                        got = [
                            r
                            async for r in stub.GenerateTokens(
                                worker_request([5], max_tokens=4), timeout=60
                            )
                        ]
                        break
                    except grpc.aio.AioRpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        await asyncio.sleep(0.05)
                assert sum(len(r.token_ids) for r in got) == 4

        asyncio.run(main())
        assert_idle(worker.address)
    finally:
        worker.stop()


def test_worker_abort_ends_the_stream_and_frees_its_blocks(services, worker_stub) -> None:
    stream = worker_stub.GenerateTokens(
        worker_request([5, 6, 7], request_id="abort-me", max_tokens=3000), timeout=60
    )
    next(stream)  # running
    assert worker_stub.Abort(worker_pb2.AbortRequest(request_ids=["abort-me"])).num_aborted == 1
    got, details, _ = status_of(stream)
    assert got == grpc.StatusCode.ABORTED and "abort-me" in details
    # idempotent, and an unknown id is no error
    again = worker_stub.Abort(worker_pb2.AbortRequest(request_ids=["abort-me", "never-seen"]))
    assert again.num_aborted == 0
    assert_idle(services.worker.address)
