"""Invalid fields against the real frontend and, as a trust boundary of its own, the worker: each
gets INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for an oversized message) naming the field, and the
services keep serving with every KV block free."""

import math
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.bad_inputs_requests import (
    INVALID,
    MAX_MODEL_LEN,
    SP,
    UNLIMITED,
    VOCAB,
    WORKER_CASES,
    MiB,
    status_of,
    worker_request,
)
from tests.e2e.processes import assert_idle

pytestmark = pytest.mark.e2e


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


@pytest.fixture(scope="module")
def frontend_stub(services) -> Iterator[frontend_grpc.FrontendServiceStub]:
    with grpc.insecure_channel(services.frontend.address, options=UNLIMITED) as channel:
        yield frontend_grpc.FrontendServiceStub(channel)


@pytest.fixture(scope="module")
def worker_stub(services) -> Iterator[worker_grpc.WorkerServiceStub]:
    with grpc.insecure_channel(services.worker.address, options=UNLIMITED) as channel:
        yield worker_grpc.WorkerServiceStub(channel)


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
