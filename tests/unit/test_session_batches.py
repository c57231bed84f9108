"""The frontend's Session batches stay within what the worker takes: _flush splits a pass's adds
and aborts into messages of at most MAX_BATCH entries and MAX_BATCH_BYTES of adds (one larger add
alone), and the slow-write merge stops at both too; the worker's list bound is far above it."""

import asyncio

from nanoserve.frontend.workers.session import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    WorkerSession,
    session_batches,
)
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.worker.service.session import session_list_bound


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
        assert [len(m.adds) for m in queued] == [MAX_BATCH, MAX_BATCH, 5, 0]
        assert [len(m.aborts) for m in queued] == [0, 0, MAX_BATCH, 1]
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


def big_adds(n: int, ids: int) -> list[worker_pb2.SessionAdd]:
    """Adds of about 3 bytes per allowed id (varints of ids past 2**14)."""
    out = []
    for i in range(n):
        request = worker_pb2.GenerateTokensRequest(request_id=str(i))
        request.sampling_params.allowed_token_ids.extend(range(100_000, 100_000 + ids))
        out.append(worker_pb2.SessionAdd(request=request))
    return out


def test_batches_are_bounded_in_bytes_too() -> None:
    """120 adds of ~200 kB (65,536 allowed ids each): 24 MB in one message would pass gRPC's
    16 MiB limit; they go in messages of at most MAX_BATCH_BYTES, in order, and a single add
    larger than the bound goes alone."""
    many = big_adds(120, 65_536)
    messages = session_batches(many, ["x"], [])
    assert all(m.ByteSize() <= MAX_BATCH_BYTES + 64 for m in messages)  # + the abort's bytes
    assert [a.request.request_id for m in messages for a in m.adds] == [str(i) for i in range(120)]
    assert len(messages) >= -(-sum(a.ByteSize() for a in many) // MAX_BATCH_BYTES) >= 6
    # the abort rides with the last add: the worker applies a message's adds first
    assert [len(m.aborts) for m in messages] == [0] * (len(messages) - 1) + [1]
    huge = big_adds(3, 1_500_000)  # ~4.5 MB each: one a message
    assert [len(m.adds) for m in session_batches(huge, [], [])] == [1, 1, 1]
    assert [len(m.aborts) for m in session_batches([], ["a", "b"], [])] == [2]


def test_the_slow_write_merge_stops_at_the_byte_bound() -> None:
    async def main() -> list[worker_pb2.SessionRequest]:
        session = WorkerSession(stub=None)  # type: ignore[arg-type]  # nothing is called on it
        outbox: asyncio.Queue = asyncio.Queue()
        for add in big_adds(60, 65_536):  # one add a message, as 60 passes of the event loop
            outbox.put_nowait(worker_pb2.SessionRequest(adds=[add]))
        call = FakeCall()
        writer = asyncio.create_task(session._write(call, outbox))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        writer.cancel()
        return call.written

    written = asyncio.run(main())
    assert sum(len(m.adds) for m in written) == 60 and len(written) > 1
    assert all(m.ByteSize() <= MAX_BATCH_BYTES for m in written)


def test_the_worker_bound_is_above_the_frontend_batch() -> None:
    assert session_list_bound(1) > MAX_BATCH


def test_an_abort_never_reaches_the_worker_before_its_add() -> None:
    """Issue 32: a pass that adds B (in the second message of adds) and aborts it must not send
    the abort first, or the worker ignores it and B runs to max_tokens for nobody."""
    many = adds(MAX_BATCH + 3)
    messages = session_batches(many, [str(MAX_BATCH + 1)], [])
    where_added = next(
        i
        for i, m in enumerate(messages)
        if any(a.request.request_id == str(MAX_BATCH + 1) for a in m.adds)
    )
    where_aborted = next(i for i, m in enumerate(messages) if m.aborts)
    assert where_aborted >= where_added


class SlowFirstWriteCall(FakeCall):
    """A stand-in Session call whose first write takes 50 ms (HTTP/2 flow control, a busy worker)."""

    async def write(self, message: worker_pb2.SessionRequest) -> None:
        if not self.written:
            await asyncio.sleep(0.05)
        self.written.append(message)


def test_the_slow_write_merge_keeps_an_abort_after_its_add() -> None:
    """Start A; while its write is slow, start B and abort B (a client cancel): the writer merges
    B's add and B's abort into one message, which the worker applies adds-first (test below)."""

    async def main() -> list[worker_pb2.SessionRequest]:
        session = WorkerSession(stub=None)  # type: ignore[arg-type]
        call = SlowFirstWriteCall()
        session.call = call  # type: ignore[assignment]  # as _open() would
        writer = asyncio.create_task(session._write(call, session.outbox))  # type: ignore[arg-type]
        session.start(worker_pb2.GenerateTokensRequest(request_id="A"), None)
        await asyncio.sleep(0.01)  # A's write is under way
        session.start(worker_pb2.GenerateTokensRequest(request_id="B"), None)
        await asyncio.sleep(0)
        session.abort("B")
        await asyncio.sleep(0.1)
        writer.cancel()
        return call.written

    written = asyncio.run(main())
    sent = [(a.request.request_id, "add") for m in written for a in m.adds]
    order = []
    for m in written:  # the worker's order within a message: adds, then aborts
        order += [("add", a.request.request_id) for a in m.adds] + [("abort", r) for r in m.aborts]
    assert ("B", "add") in sent and ("abort", "B") in order
    assert order.index(("add", "B")) < order.index(("abort", "B")), order
