"""The worker's log line for each request it refuses or aborts, under the id the frontend sent
(`client-id#n`): WorkerSession against a stand-in engine, read back with caplog."""

import asyncio
import logging
from collections.abc import AsyncIterator

from nanoserve.errors import Unavailable
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import Limits
from nanoserve.worker.service.async_engine import RequestAborted
from nanoserve.worker.service.output_stream import Collector, Stream
from nanoserve.worker.service.request_log import SHUTTING_DOWN
from nanoserve.worker.service.session import WorkerSession

LOGGER = "nanoserve.worker.requests"


class FakeEngine:
    """What WorkerSession uses of an AsyncEngine: admission count, limits, add/release/abort."""

    def __init__(self) -> None:
        self.limits = Limits(max_model_len=64, vocab_size=100, max_stop_token_ids=4)
        self.streams: dict[int, Stream] = {}
        self.next_id = 0
        self.released: list[int] = []
        self.refuse_next: str | None = None  # the engine core refuses the next add (frame limit)

    @property
    def num_requests(self) -> int:
        return len(self.streams)

    def add(
        self,
        request_id: str,
        token_ids,
        sp,
        owner: Collector | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        traceparent: str | None = None,
    ) -> Stream:
        stream = self.streams[self.next_id] = Stream(request_id, self.next_id, owner or Collector())
        self.next_id += 1
        if self.refuse_next is not None:  # as AsyncEngine._on_refused forgets and ends it
            del self.streams[stream.engine_id]
            self.end(stream, RequestAborted(f"refused by the engine: {self.refuse_next}"))
        return stream

    def release(self, stream: Stream) -> None:
        self.streams.pop(stream.engine_id, None)
        self.released.append(stream.engine_id)

    def abort_stream(self, stream: Stream) -> None:
        self.release(stream)
        self.end(stream, RequestAborted(f"request {stream.request_id!r} was aborted"))

    def end(self, stream: Stream, error: Exception) -> None:
        stream.error = error
        assert stream.owner is not None
        stream.owner.notify(stream)


def add(request_id: str, timeout_s: float = 0.0, **sampling) -> worker_pb2.SessionAdd:
    return worker_pb2.SessionAdd(
        request=worker_pb2.GenerateTokensRequest(
            request_id=request_id,
            prompt_token_ids=[1, 2, 3],
            sampling_params=common_pb2.SamplingParams(max_tokens=8, **sampling),
        ),
        timeout_s=timeout_s,
    )


def lines(caplog) -> dict[str, str]:
    """request id -> the rest of its line, for the worker's request lines; one line per id."""
    found: dict[str, str] = {}
    for record in caplog.records:
        if record.name != LOGGER:
            continue
        message = record.getMessage()
        assert message.startswith("request '"), message
        request_id, _, rest = message.removeprefix("request '").partition("' ")
        assert request_id not in found, f"two lines for {request_id}: {found[request_id]} / {rest}"
        found[request_id] = rest
    return found


async def no_messages() -> AsyncIterator[worker_pb2.SessionRequest]:
    return
    yield  # pragma: no cover - an async generator that ends at once


async def refuse_and_abort_one_of_each() -> None:
    engine = FakeEngine()
    draining = False

    def check_ready() -> FakeEngine:
        if draining:
            raise Unavailable("the worker is shutting down")
        return engine

    session = WorkerSession(engine, 3, check_ready)  # type: ignore[arg-type]
    # validation: a bad sampling value, a negative timeout, too many stop ids
    session.add(add("bad-temp#1", temperature=-1.0))
    session.add(add("bad-timeout#2", timeout_s=-1.0))
    session.add(add("many-stops#3", stop_token_ids=list(range(5))))
    # the engine core refuses it (a frame it cannot carry)
    engine.refuse_next = "the frame is over its size limit"
    session.add(add("frame#4"))
    engine.refuse_next = None
    # admission: three live requests fill max_queued_requests=3, the fourth is refused
    for request_id in ("cancel#5", "operator#6", "deadline#7"):
        session.add(add(request_id, timeout_s=0.05 if request_id == "deadline#7" else 0.0))
    session.add(add("full#8"))
    # the frontend aborts one (its client cancelled) in a SessionRequest
    await session.read(aiter_of(worker_pb2.SessionRequest(aborts=["cancel#5", "unknown#9"])))
    session.reading = True
    assert session.abort_by_operator("operator") == 1  # WorkerService.Abort names the client's id
    await asyncio.sleep(0.2)  # deadline#7's timeout_s passes
    session.take_outputs()  # the engine's refusal and the operator's abort are written here
    # shutdown: what is still live when the stream ends
    session.add(add("shutdown#10"))
    session.close(SHUTTING_DOWN)
    draining = True
    session.add(add("draining#11"))


def test_each_refusal_and_abort_leaves_one_line_with_the_request_id(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    asyncio.run(refuse_and_abort_one_of_each())
    found = lines(caplog)
    assert found.pop("bad-temp#1").startswith("INVALID_ARGUMENT: sampling_params.temperature")
    assert found.pop("bad-timeout#2").startswith("INVALID_ARGUMENT: timeout_s")
    assert found.pop("many-stops#3").startswith("INVALID_ARGUMENT: sampling_params.stop_token_ids")
    assert (
        found.pop("frame#4") == "ABORTED: refused by the engine: the frame is over its size limit"
    )
    assert found.pop("full#8").startswith("RESOURCE_EXHAUSTED: 3 requests are in flight")
    assert found.pop("cancel#5").startswith("CANCELLED: aborted by its caller")
    assert found.pop("operator#6") == "ABORTED: request 'operator#6' was aborted"
    assert found.pop("deadline#7") == "DEADLINE_EXCEEDED: the request's timeout_s passed"
    assert found.pop("shutdown#10").startswith("UNAVAILABLE: the worker is shutting down")
    assert found.pop("draining#11") == "UNAVAILABLE: the worker is shutting down"
    assert found == {}  # unknown#9 was not live: no line


async def aiter_of(
    *messages: worker_pb2.SessionRequest,
) -> AsyncIterator[worker_pb2.SessionRequest]:
    for message in messages:
        yield message


def test_json_log_format_writes_one_object_a_line(caplog) -> None:
    import json

    from nanoserve.worker.service.request_log import log_request_end, use_log_format

    use_log_format("json")
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            log_request_end('odd "id"\n#1', "CANCELLED", "aborted by its caller")
    finally:
        use_log_format("text")
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert "\n" not in record.getMessage()
    assert json.loads(record.getMessage()) == {
        "request_id": 'odd "id"\n#1',
        "code": "CANCELLED",
        "reason": "aborted by its caller",
    }
