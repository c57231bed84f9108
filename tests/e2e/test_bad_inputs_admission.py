"""Admission control: past --max-concurrent-requests the frontend refuses a request, past
--max-queued-requests the worker does (RESOURCE_EXHAUSTED), and room comes back after cancels."""

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import AsyncClient
from nanoserve.errors import ResourceExhausted
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.bad_inputs_requests import worker_request
from tests.e2e.processes import Service, assert_idle, start_frontend

pytestmark = pytest.mark.e2e


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
    from tests.e2e.processes import start_worker

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
