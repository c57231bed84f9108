"""The frontend's end of WorkerService.Session: every request of this frontend process travels on one
bidirectional stream to the worker. Adds and aborts made in one pass of the event loop go out as one
message; each worker message (one engine step) is fanned out to the requests' Pending outputs.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio

from nanoserve.errors import Unavailable
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

logger = logging.getLogger(__name__)


# Entries per list in one SessionRequest: the worker refuses a batch past 4 x its
# max_queued_requests + 1024 (worker.service.session.session_list_bound), so a frontend that admits more
# than that at once still sends batches it takes.
MAX_BATCH = 1024
# Bytes of adds in one SessionRequest: well under gRPC's 16 MiB message limit (a thousand long
# prompts or allowed_token_ids lists would pass it, and a message past it breaks the session for
# every request on it). One add larger than this goes alone: the worker's limit admits any valid one.
MAX_BATCH_BYTES = 4 * 1024 * 1024


def _size(message: worker_pb2.SessionRequest) -> int:
    return max(len(message.adds), len(message.aborts), len(message.completion_aborts))


def session_batches(
    adds: list[worker_pb2.SessionAdd],
    aborts: list[str],
    completion_aborts: list[worker_pb2.CompletionAbort],
    max_entries: int = MAX_BATCH,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[worker_pb2.SessionRequest]:
    """The SessionRequests that carry these entries, in order: at most max_entries per list and,
    past one add, at most max_bytes of adds. The worker applies a message's adds before its aborts,
    so the aborts ride in the last add message and after it: an abort never reaches the worker
    before the add of its request (the pass may have added and aborted it)."""
    groups: list[list[worker_pb2.SessionAdd]] = [[]]
    size = 0
    for add in adds:
        add_bytes = add.ByteSize()  # computed by the C library, without serializing
        if groups[-1] and (len(groups[-1]) >= max_entries or size + add_bytes > max_bytes):
            groups.append([])
            size = 0
        groups[-1].append(add)
        size += add_bytes
    first = len(groups) - 1  # the message the aborts start in
    count = max(
        len(groups),
        first + -(-len(aborts) // max_entries),
        first + -(-len(completion_aborts) // max_entries),
    )

    def part(entries: list, i: int) -> list:
        return (
            entries[(i - first) * max_entries : (i - first + 1) * max_entries] if i >= first else []
        )

    return [
        worker_pb2.SessionRequest(
            adds=groups[i] if i < len(groups) else [],
            aborts=part(aborts, i),
            completion_aborts=part(completion_aborts, i),
        )
        for i in range(max(count, 1))
    ]


@dataclass(eq=False, slots=True)
class Pending:
    """One request's output not yet taken by its handler, per completion (SamplingParams.n): new
    ids merged into one list (at most one pending delta per completion), and the worker's last
    output once the completion ended (or the request failed: an error ends all of them)."""

    n: int = 1
    ids: list[list[int]] = field(default_factory=list)  # per completion index
    lasts: list[worker_pb2.SessionOutput | None] = field(default_factory=list)
    num_ended: int = 0
    taken: int = 0  # completions whose end the handler took
    error: Exception | None = None  # the session itself broke
    min_ids: int = 1  # stream_interval: wake the handler only once this many ids wait
    cached_tokens: int = 0  # the prompt's prefix-cache hit, sent with the first output
    # TokenLogprobs of those ids (per completion) and of prompt positions, when asked for
    logprobs: list[list[common_pb2.TokenLogprobs]] = field(default_factory=list)
    prompt_logprobs: list[common_pb2.TokenLogprobs] = field(default_factory=list)
    # made on the loop: take()'s wait is one bare future, without asyncio.Event's per-wait
    # get_running_loop (a getpid syscall on 3.11) and waiter deque, once per message
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    woken: bool = False  # new output or an end since take() last returned
    waiter: asyncio.Future | None = None  # take()'s, while it waits

    def __post_init__(self) -> None:
        self.ids = [[] for _ in range(self.n)]
        self.lasts = [None] * self.n
        self.logprobs = [[] for _ in range(self.n)]

    def wake(self) -> None:
        """New output or an end: take() returns now, or at once when next called."""
        self.woken = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        if not self.woken:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    @property
    def ended(self) -> bool:
        return self.num_ended > self.taken or self.error is not None

    def end(self, index: int, out: worker_pb2.SessionOutput) -> bool:
        """Completion `index` ended (or, with an error, all); True once the request has."""
        if out.error_code:
            self.lasts = [out] * self.n
            self.num_ended = self.n
        elif self.lasts[index] is None:
            self.lasts[index] = out
            self.num_ended += 1
        return self.num_ended == self.n

    def take_logprobs(
        self, index: int
    ) -> tuple[list[common_pb2.TokenLogprobs], list[common_pb2.TokenLogprobs]]:
        """(logprobs of the ids take() returned for completion `index`, new prompt logprobs: with
        completion 0's), emptied."""
        logprobs, self.logprobs[index] = self.logprobs[index], []
        if index != 0:
            return logprobs, []
        prompt, self.prompt_logprobs = self.prompt_logprobs, []
        return logprobs, prompt

    async def take(self) -> list[tuple[int, list[int], worker_pb2.SessionOutput | None]]:
        """Waits for new ids or an end; returns (index, ids, the last output or None) of each
        completion with output. Raises when the session broke."""
        if self.n == 1:  # the common case, without the generator
            if not (self.ended or len(self.ids[0]) >= self.min_ids):
                await self._wait()
        elif not (self.ended or any(len(ids) >= self.min_ids for ids in self.ids)):
            await self._wait()
        self.woken = False
        if self.error is not None:
            raise self.error
        if self.n == 1 and not self.prompt_logprobs:
            ids, last = self.ids[0], self.lasts[0]
            if not ids and last is None:
                return []
            self.ids[0] = []
            if last is not None:
                self.lasts[0] = None  # taken: reported once
                self.taken += 1
            return [(0, ids, last)]
        out = []
        for index, (ids, last) in enumerate(zip(self.ids, self.lasts)):
            if ids or last is not None or (index == 0 and self.prompt_logprobs):
                out.append((index, ids, last))
                self.ids[index] = []
                if last is not None:
                    self.lasts[index] = None  # taken: reported once
                    self.taken += 1
        return out


class WorkerSession:
    """Opened on first use and again after it breaks; closing it (or losing it) makes the worker
    abort every request on it."""

    def __init__(
        self,
        stub: worker_grpc.WorkerServiceStub,
        on_broken: Callable[[str], None] | None = None,
        on_load: Callable[[worker_pb2.GetLoadResponse], None] | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.stub = stub
        self.metadata = metadata  # the worker link's bearer token
        self.on_broken = on_broken  # told why, when the worker side broke it (not on close)
        self.on_load = on_load  # given each load report the worker sends on the session
        self.call: grpc.aio.StreamStreamCall | None = None
        self.pending: dict[str, Pending] = {}  # request id -> its output
        self.adds: list[worker_pb2.SessionAdd] = []
        self.aborts: list[str] = []
        self.completion_aborts: list[worker_pb2.CompletionAbort] = []
        self.flush_scheduled = False
        self.outbox: asyncio.Queue[worker_pb2.SessionRequest] = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.closing = False

    def start(self, request: worker_pb2.GenerateTokensRequest, timeout_s: float | None) -> Pending:
        """Queues a request (its id unique within this process); its outputs arrive on Pending."""
        if self.call is None:
            self._open()
        n = request.sampling_params.n if request.sampling_params.HasField("n") else 1
        pending = self.pending[request.request_id] = Pending(max(n, 1))
        self.adds.append(worker_pb2.SessionAdd(request=request, timeout_s=timeout_s or 0.0))
        self._schedule_flush()
        return pending

    def abort(self, request_id: str) -> None:
        """Ends a request that has not ended (cancelled, stop string); frees its KV blocks."""
        if self.pending.pop(request_id, None) is not None and self.call is not None:
            self.aborts.append(request_id)
            self._schedule_flush()

    def abort_completion(self, request_id: str, index: int) -> None:
        """Ends one completion of an n > 1 request that goes on (a stop string matched in it):
        the worker stops generating it and frees the KV blocks it does not share."""
        if request_id in self.pending and self.call is not None:
            self.completion_aborts.append(
                worker_pb2.CompletionAbort(request_id=request_id, index=index)
            )
            self._schedule_flush()

    def _open(self) -> None:
        self.call = call = self.stub.Session(wait_for_ready=False, metadata=self.metadata)
        self.outbox = asyncio.Queue()
        self.tasks = [
            asyncio.create_task(self._write(call, self.outbox), name="session-writer"),
            asyncio.create_task(self._read(call), name="session-reader"),
        ]

    def _schedule_flush(self) -> None:
        # everything added or aborted in this pass of the event loop goes out in one message
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        adds, aborts, completion_aborts = self.adds, self.aborts, self.completion_aborts
        self.adds, self.aborts, self.completion_aborts = [], [], []
        if adds or aborts or completion_aborts:
            for message in session_batches(adds, aborts, completion_aborts):
                self.outbox.put_nowait(message)

    async def _write(self, call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue) -> None:
        with contextlib.suppress(
            grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError
        ):
            while True:
                message = await outbox.get()
                size = message.ByteSize()
                while not outbox.empty():  # the previous write was slow: merge what queued up
                    more = outbox.get_nowait()
                    more_size = more.ByteSize()
                    if (
                        _size(message) + _size(more) > MAX_BATCH
                        or size + more_size > MAX_BATCH_BYTES
                    ):
                        await call.write(message)
                        message, size = more, more_size
                        continue
                    message.adds.extend(more.adds)
                    message.aborts.extend(more.aborts)
                    message.completion_aborts.extend(more.completion_aborts)
                    size += more_size
                await call.write(message)

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        reason = "the worker ended the session"
        try:
            async for response in call:
                if response.HasField("load") and self.on_load is not None:
                    self.on_load(response.load)
                pending = self.pending
                for out in response.outputs:
                    p = pending.get(out.request_id)
                    if p is None:
                        continue  # aborted meanwhile
                    index = out.index if out.index < p.n else 0
                    ids = p.ids[index]
                    ids += out.token_ids
                    if out.logprobs or out.prompt_logprobs:
                        p.logprobs[index] += out.logprobs
                        p.prompt_logprobs += out.prompt_logprobs
                    if out.HasField("usage") and out.usage.cached_tokens:
                        p.cached_tokens = out.usage.cached_tokens  # early: with the first ids
                    if out.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED or out.error_code:
                        if p.end(index, out):
                            del pending[out.request_id]
                        p.wake()
                    elif len(ids) >= p.min_ids:
                        p.wake()
        except grpc.aio.AioRpcError as e:
            reason = f"the session with the worker broke ({e.code().name}: {e.details()})"
        finally:
            self._broken(call, reason)

    def _broken(self, call: grpc.aio.StreamStreamCall, reason: str) -> None:
        """Every request on the session ends UNAVAILABLE; the next request opens a new one."""
        if self.call is None or self.call is not call:  # a later session's, or none open
            return
        self.call = None
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self.pending:
            logger.warning("%s: %d requests end UNAVAILABLE", reason, len(self.pending))
        for p in self.pending.values():
            p.error = Unavailable(reason)
            p.wake()
        self.pending.clear()
        self.adds, self.aborts, self.completion_aborts = [], [], []
        call.cancel()
        if self.on_broken is not None and not self.closing:
            self.on_broken(reason)

    async def close(self) -> None:
        self.closing = True
        if self.call is not None:
            self._broken(self.call, "the frontend is stopping")
        await asyncio.gather(*self.tasks, return_exceptions=True)
