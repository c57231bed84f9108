"""Garbage bytes (not a protobuf message) get INVALID_ARGUMENT and one log line from either
service; an operator's WorkerService.Abort reaches the client as ABORTED."""

import time

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.errors import Aborted
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.hostile_calls import INVALID, status_of, unary_status
from tests.e2e.processes import assert_idle

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("service", "method", "streaming"),
    [
        ("frontend", "/nanoserve.v1.FrontendService/Generate", True),
        ("frontend", "/nanoserve.v1.FrontendService/Tokenize", False),
        ("worker", "/nanoserve.v1.WorkerService/GenerateTokens", True),
        ("worker", "/nanoserve.v1.WorkerService/GetLoad", False),
        ("frontend", "/grpc.health.v1.Health/Check", False),  # not a nanoserve servicer
        ("worker", "/grpc.health.v1.Health/Watch", True),
    ],
)
def test_garbage_bytes_get_invalid_argument_and_one_log_line(
    services, service, method, streaming
) -> None:
    target = getattr(services, service)
    before = len(target.lines)
    garbage = b"\xff\xfe\x00garbage" * 8  # not a protobuf message
    with grpc.insecure_channel(target.address) as channel:
        if streaming:
            call = channel.unary_stream(method)(garbage, timeout=30)
            code, details = status_of(call)
        else:
            code, details = unary_status(lambda: channel.unary_unary(method)(garbage, timeout=30))
    assert code == INVALID, details
    assert "request: not a valid" in details
    time.sleep(0.3)  # let the service's output reach the reader thread
    new = target.lines[before:]
    assert sum("refused before its handler" in line for line in new) == 1, "".join(new)
    assert not any("Traceback" in line for line in new), "".join(new)


def test_operator_abort_reaches_the_client_as_aborted(services) -> None:
    with (
        Client(services.frontend.address, timeout=60) as client,
        grpc.insecure_channel(services.worker.address) as channel,
    ):
        stream = client.generate_stream("Tell me a story", request_id="to-abort", max_tokens=3000)
        next(stream)  # running on the worker
        stub = worker_grpc.WorkerServiceStub(channel)
        aborted = stub.Abort(worker_pb2.AbortRequest(request_ids=["to-abort"]), timeout=10)
        assert aborted.num_aborted == 1
        with pytest.raises(Aborted, match="aborted"):
            for _ in stream:
                pass
    assert_idle(services.worker.address)
