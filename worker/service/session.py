"""WorkerService.Session: one frontend's requests multiplexed on one bidirectional stream.

Adds and aborts arrive in batches (SessionRequest); every frame of the engine core that touches the
session's requests becomes one SessionResponse, which also carries the worker's load when it is due
(worker.service.load_report). When the stream ends, every live request is aborted.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from nanoserve.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ServiceError,
)
from nanoserve.logprob_split import MAX_LOGPROBS_PER_MESSAGE
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.tracing import traceparent_from
from nanoserve.wire import MAX_WORKER_REQUEST_ID_LENGTH
from nanoserve.worker.service.admission import add_logprobs, admit, set_finish, stream_error
from nanoserve.worker.service.async_engine import AsyncEngine
from nanoserve.worker.service.load_report import LoadReporter, load_key, session_load
from nanoserve.worker.service.output_stream import Collector, Stream
from nanoserve.worker.service.request_log import (
    CANCELLED_BY_CALLER,
    SESSION_ENDED,
    log_request_end,
)

logger = logging.getLogger(__name__)


class WorkerSession:
    """The worker's side of one Session stream: its live requests, their deadlines, and the
    outputs not yet written."""

    def __init__(
        self,
        engine: AsyncEngine,
        max_queued_requests: int,
        check_ready: Callable[[], AsyncEngine],
        draining: Callable[[], bool] = lambda: False,
        reporter: LoadReporter | None = None,
    ):
        """`draining()`: whether the worker drains (its load reports say so)."""
        self.engine, self.max_queued_requests = engine, max_queued_requests
        self.check_ready = check_ready  # raises UNAVAILABLE while draining or once the engine died
        self.loop = asyncio.get_running_loop()
        self.collector = Collector()
        self.live: dict[str, Stream] = {}  # request id -> stream
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.refused: list[worker_pb2.SessionOutput] = []  # requests ended outside the engine
        self.taken_entries = 0  # logprob entries in the last take_outputs (split past the bound)
        self.reading = True
        self.error: InvalidArgument | None = None  # a message past the bounds ends the session
        self.draining = draining
        self.reporter = reporter or LoadReporter()
        self.caller: str | None = None  # who opened it (the worker token's name): Abort's scope

    async def read(self, requests: AsyncIterator[worker_pb2.SessionRequest]) -> None:
        """Applies the frontend's batches until it closes its side of the stream."""
        try:
            async for message in requests:
                # bounded before walked: a frontend never has more live requests on a worker
                # than max_queued_requests, so a batch past this bound is not one (nothing of
                # it is applied; the session ends with INVALID_ARGUMENT)
                bound = session_list_bound(self.max_queued_requests)
                for name in ("adds", "aborts", "completion_aborts"):
                    if len(getattr(message, name)) > bound:
                        self.error = InvalidArgument(
                            f"more than {bound} entries in one message", field=name
                        )
                        return
                # in the order they were made: a message may add a request and abort it (the
                # frontend merges queued messages when a write was slow), so adds go first
                for add in message.adds:
                    self.add(add)
                for request_id in message.aborts:
                    if self.abort(request_id):
                        log_request_end(request_id, "CANCELLED", CANCELLED_BY_CALLER)
                for completion in message.completion_aborts:
                    self.abort_completion(completion.request_id, completion.index)
        finally:
            self.reading = False
            self.collector.event.set()

    def add(self, add: worker_pb2.SessionAdd) -> None:
        request = add.request
        request_id = request.request_id
        try:
            if not request_id or len(request_id) > MAX_WORKER_REQUEST_ID_LENGTH:
                raise InvalidArgument(
                    f"must have 1 to {MAX_WORKER_REQUEST_ID_LENGTH} characters", field="request_id"
                )
            if request_id in self.live:
                raise InvalidArgument(
                    f"{request_id!r} is already running in this session", field="request_id"
                )
            if not add.timeout_s >= 0:
                raise InvalidArgument(f"must be >= 0, got {add.timeout_s}", field="timeout_s")
            stream = admit(
                self.check_ready(),
                request,
                request_id,
                self.max_queued_requests,
                owner=self.collector,
                traceparent=traceparent_from(request.traceparent),
            )
        except ServiceError as e:
            self.refuse(request_id[:MAX_WORKER_REQUEST_ID_LENGTH], e)
            return
        self.live[request_id] = stream
        if add.timeout_s > 0:
            self.timers[request_id] = self.loop.call_later(add.timeout_s, self.expire, request_id)

    def refuse(self, request_id: str, error: ServiceError) -> None:
        log_request_end(request_id, error.code.name, str(error))
        self.refused.append(
            worker_pb2.SessionOutput(
                request_id=request_id, error_code=error.code.value[0], error_message=str(error)
            )
        )
        self.collector.event.set()

    def abort(self, request_id: str) -> bool:
        """Ends a live request without output; the engine frees its blocks before its next step."""
        stream = self.live.pop(request_id, None)
        if stream is None:
            return False
        self.engine.release(stream)
        self.collector.ready.pop(stream.engine_id, None)
        timer = self.timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        return True

    def abort_completion(self, request_id: str, index: int) -> None:
        """Ends one completion of a live n > 1 request (the frontend matched a stop string in
        it); the request ends here once its last open completion did. Unknown ids, indexes out of
        range and completions that ended are ignored."""
        stream = self.live.get(request_id)
        if stream is None or not self.engine.abort_completion(stream, index):
            return
        if stream.finished:  # its last open completion: the engine released it; take_outputs
            self.collector.notify(stream)  # writes what the others left and ends it here

    def abort_by_operator(self, request_id: str) -> int:
        """WorkerService.Abort: ends the live requests named `request_id`, or `request_id#n` as
        the frontend names them, with ABORTED (their outputs are written as errors)."""
        named = [
            stream
            for live_id, stream in self.live.items()
            if live_id == request_id or live_id.rpartition("#")[0] == request_id
        ]
        for stream in named:
            self.engine.abort_stream(stream)  # take_outputs ends it, and its timer
        return len(named)

    def expire(self, request_id: str) -> None:
        self.timers.pop(request_id, None)
        if self.abort(request_id):
            self.refuse(request_id, DeadlineExceeded("the request's timeout_s passed"))

    def close(self, ended: tuple[str, str] = SESSION_ENDED) -> None:
        """The stream ended: abort whatever still runs, each logged with `ended` (code, why)."""
        for request_id in list(self.live):
            self.abort(request_id)
            log_request_end(request_id, *ended)
        if self.live or self.timers:  # pragma: no cover - abort() empties both
            raise AssertionError("session requests left behind")

    def take_outputs(self) -> worker_pb2.SessionResponse:
        """Everything produced since the last call: each request's merged new ids, ends, errors
        (self.taken_entries: how many logprob entries they carry)."""
        response = worker_pb2.SessionResponse()
        outputs = response.outputs
        self.taken_entries = 0
        for stream in self.collector.take():
            if self.live.get(stream.request_id) is not stream:
                continue  # aborted meanwhile
            if stream.error is not None:
                error = stream_error(stream.error)  # an operator's Abort, the engine refused it
                outputs.add(
                    request_id=stream.request_id,
                    error_code=error.code.value[0],
                    error_message=str(error),
                )
                log_request_end(stream.request_id, error.code.name, str(error))
            else:
                # one output per completion with news (more when its logprobs are many)
                for taken in (piece for t in stream.take() for piece in t.pieces()):
                    out = outputs.add(
                        request_id=stream.request_id, token_ids=taken.ids, index=taken.index
                    )
                    if taken.logprobs is not None or taken.prompt_logprobs is not None:
                        add_logprobs(out.logprobs, taken.logprobs)
                        add_logprobs(out.prompt_logprobs, taken.prompt_logprobs)
                        self.taken_entries += len(taken.logprobs or ()) + len(
                            taken.prompt_logprobs or ()
                        )
                    if taken.finish is not None:
                        set_finish(out, taken.finish)
                    elif stream.cached_tokens is not None and not stream.cached_sent:
                        # usage early, cached_tokens only: a stop string may end it frontend-side
                        out.usage.cached_tokens = stream.cached_tokens
                        stream.cached_sent = True
                if not stream.finished:
                    continue
            del self.live[stream.request_id]
            timer = self.timers.pop(stream.request_id, None)
            if timer is not None:
                timer.cancel()
        outputs.extend(self.refused)
        self.refused.clear()
        return response

    async def responses(self) -> AsyncIterator[worker_pb2.SessionResponse]:
        """Until the frontend has closed its side and no request of the session is live."""
        event = self.collector.event
        while self.error is None and (self.reading or self.live or self.refused):
            load = self.engine.load
            key = load_key(load, self.draining())
            if not event.is_set():
                # woken by outputs (every step while its requests run), or when a report is due
                wait_s = self.reporter.wait_s(
                    key, self.loop.time(), busy=bool(load.num_running or load.num_waiting)
                )
                timer = self.loop.call_later(wait_s, event.set)  # a timer, not a task per wait
                try:
                    await event.wait()
                finally:
                    timer.cancel()
            response = self.take_outputs()
            if self.taken_entries > MAX_LOGPROBS_PER_MESSAGE:  # split: each part under the bound
                parts = bounded_responses(response)
            else:  # one message as it is (bounded_responses copies every output)
                parts = [response] if response.outputs else []
            load = self.engine.load
            draining = self.draining()
            if self.reporter.due(load_key(load, draining), self.loop.time()):
                if not parts:  # a response with only the load
                    parts.append(worker_pb2.SessionResponse())
                parts[-1].load.CopyFrom(session_load(load, draining))
            for part in parts:
                yield part


def bounded_responses(
    response: worker_pb2.SessionResponse, max_entries: int = MAX_LOGPROBS_PER_MESSAGE
) -> list[worker_pb2.SessionResponse]:
    """`response` as consecutive responses of at most `max_entries` logprob entries each (every
    output already has at most that many: Taken.pieces), outputs in order; none when empty."""
    parts: list[worker_pb2.SessionResponse] = []
    count = max_entries  # entries in parts[-1]; full: the first output opens a part
    for out in response.outputs:
        entries = len(out.logprobs) + len(out.prompt_logprobs)
        if not parts or (entries and count + entries > max_entries):
            parts.append(worker_pb2.SessionResponse())
            count = 0
        parts[-1].outputs.append(out)
        count += entries
    return parts


def session_list_bound(max_queued_requests: int) -> int:
    """The most adds, aborts or completion aborts one SessionRequest may carry (several per
    live request: a request can be added, aborted and, with n > 1, end completions in one pass)."""
    return 4 * max_queued_requests + 1024


async def run_session(
    session: WorkerSession,
    requests: AsyncIterator,
    why_closed: Callable[[], tuple[str, str]] = lambda: SESSION_ENDED,
) -> AsyncIterator[worker_pb2.SessionResponse]:
    """`why_closed()`: (code, why) logged for each request still live when the stream ends."""
    reader = asyncio.create_task(session.read(requests), name="session-reader")
    try:
        async for response in session.responses():
            yield response
        if session.error is not None:
            raise session.error
    finally:
        reader.cancel()
        session.close(why_closed())
        if not reader.done():
            await asyncio.gather(reader, return_exceptions=True)
