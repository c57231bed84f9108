"""Bridge between the gRPC event loop and the engine: the engine steps on its own thread.

Adds and aborts are queued by the event loop and applied by the engine thread between steps, so the
scheduler needs no locks; each step's outputs go back to the loop in one call_soon_threadsafe.
"""
import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nanoserve.worker.engine.llm_engine import LLMEngine
from nanoserve.worker.engine.sequence import FinishReason, Sequence
from nanoserve.worker.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TokenDelta:
    """New ids of one request; `seq` is set on the last delta (finish reason and usage)."""
    token_ids: list[int]
    seq: Sequence | None = None


class EngineDead(RuntimeError):
    """The engine thread failed; every stream ends with this error."""


class RequestAborted(RuntimeError):
    """The request was ended by WorkerService.Abort or refused by the engine thread."""


@dataclass(slots=True)
class Stream:
    """One request's handle: its engine-side id (unique for the process: a reused request_id never
    receives an ended request's tokens) and the queue its deltas arrive on."""
    request_id: str
    engine_id: str
    queue: asyncio.Queue


class AsyncEngine:

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop,
                 on_fatal: Callable[[BaseException], None]):
        self.engine, self.loop, self.on_fatal = engine, loop, on_fatal
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        # owned by the event loop
        self.streams: dict[str, Stream] = {}  # engine id -> stream
        self.by_request_id: dict[str, Stream] = {}  # the caller's id -> stream
        self.next_id = itertools.count()
        self.error: BaseException | None = None
        self.stopped = False
        self.num_finished = 0
        # (time, prompt tokens done, generated tokens) samples for the rates in GetLoad
        self.history: collections.deque = collections.deque(maxlen=64)
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.thread.start()

    @property
    def num_requests(self) -> int:
        return len(self.streams)

    def add(self, request_id: str, token_ids: list[int], sp: SamplingParams) -> Stream:
        """Validates (ValueError) and queues a request; its deltas arrive on the stream's queue."""
        if self.error is not None:
            raise EngineDead(str(self.error))
        if request_id in self.by_request_id:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.engine.validate(token_ids, sp)
        stream = Stream(request_id, str(next(self.next_id)), asyncio.Queue())
        self.streams[stream.engine_id] = self.by_request_id[request_id] = stream
        self.inbox.put(("add", stream.engine_id, token_ids, sp))
        self.wakeup.set()
        return stream

    def abort(self, request_id: str) -> bool:
        """WorkerService.Abort: ends the request's stream (RequestAborted). Idempotent."""
        stream = self.by_request_id.get(request_id)
        if stream is None:
            return False
        self.release(stream)
        stream.queue.put_nowait(RequestAborted(f"request {request_id!r} was aborted"))
        return True

    def release(self, stream: Stream) -> None:
        """Forget a stream that ends early (cancelled, deadline, error, abort); the engine frees its
        blocks before the next step. Idempotent."""
        if self.streams.pop(stream.engine_id, None) is None:
            return
        self.by_request_id.pop(stream.request_id, None)
        self.inbox.put(("abort", stream.engine_id))
        self.wakeup.set()

    def stop(self) -> None:
        self.stopped = True
        self.wakeup.set()
        self.thread.join(timeout=10)

    # ---- engine thread --------------------------------------------------------------------------

    def _apply_inbox(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                _, engine_id, token_ids, sp = msg
                try:
                    self.engine.add_request(token_ids, sp, engine_id)
                except ValueError as e:  # validated already; ends the stream all the same
                    logger.warning("request %s refused by the engine: %s", engine_id, e)
                    self.loop.call_soon_threadsafe(self._refuse, engine_id, str(e))
            else:
                self.engine.abort(msg[1])

    def _run(self) -> None:
        try:
            while not self.stopped:
                self._apply_inbox()
                if self.engine.is_finished():
                    self.wakeup.wait(timeout=1.0)
                    self.wakeup.clear()
                    continue
                outputs = self.engine.step()
                e = self.engine
                self.history.append((time.monotonic(), e.num_prompt_tokens_done,
                                     e.num_generated_tokens))
                if outputs:
                    deltas = [(o.seq.request_id, TokenDelta(o.new_token_ids,
                                                           o.seq if o.finished else None))
                              for o in outputs]
                    self.loop.call_soon_threadsafe(self._dispatch, deltas)
        except BaseException as exc:  # noqa: BLE001 - a dead engine must end every stream
            logger.exception("engine thread failed")
            exc = self.engine.model_runner.explain(exc)
            self.error = exc
            self.loop.call_soon_threadsafe(self.fail, exc)

    # ---- event loop -----------------------------------------------------------------------------

    def _dispatch(self, deltas: list[tuple[str, TokenDelta]]) -> None:
        for engine_id, delta in deltas:
            stream = self.streams.get(engine_id)
            if stream is None:
                continue  # ended meanwhile
            stream.queue.put_nowait(delta)
            if delta.seq is not None:
                del self.streams[engine_id]
                self.by_request_id.pop(stream.request_id, None)
                self.num_finished += 1

    def _refuse(self, engine_id: str, reason: str) -> None:
        stream = self.streams.pop(engine_id, None)
        if stream is not None:
            self.by_request_id.pop(stream.request_id, None)
            stream.queue.put_nowait(RequestAborted(f"refused by the engine: {reason}"))

    def fail(self, exc: BaseException) -> None:
        """The engine is dead (its thread raised, or a tensor-parallel rank died)."""
        if self.error is None:
            self.error = exc
        for stream in self.streams.values():
            stream.queue.put_nowait(EngineDead(str(exc)))
        self.streams.clear()
        self.by_request_id.clear()
        self.on_fatal(exc)

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the recent steps."""
        # tuple() copies in one C call: the engine thread appends meanwhile
        samples = [s for s in tuple(self.history) if s[0] > time.monotonic() - 10.0]
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0.0, 0.0
        dt = samples[-1][0] - samples[0][0]
        return (samples[-1][1] - samples[0][1]) / dt, (samples[-1][2] - samples[0][2]) / dt


__all__ = ["AsyncEngine", "EngineDead", "FinishReason", "RequestAborted", "Stream", "TokenDelta"]
