"""Request ids as a client may misuse them: a duplicate in flight is refused, one reused after a
cancel gets only its own tokens, and WorkerService.Abort ends a stream and frees its blocks."""

import time
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.errors import AlreadyExists
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.bad_inputs_requests import INVALID, UNLIMITED, status_of, worker_request
from tests.e2e.processes import assert_idle

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker_stub(services) -> Iterator[worker_grpc.WorkerServiceStub]:
    with grpc.insecure_channel(services.worker.address, options=UNLIMITED) as channel:
        yield worker_grpc.WorkerServiceStub(channel)


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
