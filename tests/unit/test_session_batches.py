"""The frontend's Session batches stay within what the worker takes: _flush splits a pass's adds
and aborts into messages of at most MAX_BATCH entries, and the slow-write merge stops there too;
the worker's bound is far above it."""

import asyncio

from nanoserve.frontend.worker_session import MAX_BATCH, WorkerSession
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.worker.session import session_list_bound


def adds(n: int) -> list[worker_pb2.SessionAdd]:
    return [
        worker_pb2.SessionAdd(request=worker_pb2.GenerateTokensRequest(request_id=str(i)))
        for i in range(n)
    ]


class FakeCall:
    def __init__(self) -> None:
        self.written: list[worker_pb2.SessionRequest] = []

    async def write(self, message: worker_pb2.SessionRequest) -> None:
        self.written.append(message)


def test_flush_splits_a_large_pass_and_write_merges_up_to_the_bound() -> None:
    async def main() -> None:
        session = WorkerSession(stub=None)  # type: ignore[arg-type]  # nothing is called on it
        session.adds = adds(2 * MAX_BATCH + 5)
        session.aborts = [f"a{i}" for i in range(MAX_BATCH + 1)]
        session._flush()
        queued = [session.outbox.get_nowait() for _ in range(session.outbox.qsize())]
        assert [len(m.adds) for m in queued] == [MAX_BATCH, MAX_BATCH, 5]
        assert [len(m.aborts) for m in queued] == [MAX_BATCH, 1, 0]
        small = [worker_pb2.SessionRequest(adds=adds(300)) for _ in range(5)]
        outbox: asyncio.Queue = asyncio.Queue()
        for message in small:
            outbox.put_nowait(message)
        call = FakeCall()
        writer = asyncio.create_task(session._write(call, outbox))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        writer.cancel()
        assert sum(len(m.adds) for m in call.written) == 1500
        assert all(len(m.adds) <= MAX_BATCH for m in call.written) and len(call.written) == 2

    asyncio.run(main())


def test_the_worker_bound_is_above_the_frontend_batch() -> None:
    assert session_list_bound(1) > MAX_BATCH
