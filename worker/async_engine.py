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

from worker.engine.llm_engine import LLMEngine
from worker.engine.sequence import FinishReason, Sequence
from worker.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TokenDelta:
    """New ids of one request; `seq` is set on the last delta (finish reason and usage)."""
    token_ids: list[int]
    seq: Sequence | None = None


class EngineDead(RuntimeError):
    """The engine thread failed; every stream ends with this error."""


class AsyncEngine:

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop,
                 on_fatal: Callable[[BaseException], None]):
        self.engine, self.loop, self.on_fatal = engine, loop, on_fatal
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        # owned by the event loop. Streams are keyed by an engine-side id unique for the process, not
        # by the caller's request_id: a step's deltas for a request aborted just before must not reach
        # a new request that reuses its id
        self.streams: dict[str, asyncio.Queue] = {}  # engine id -> stream
        self.engine_ids: dict[str, str] = {}  # caller's request_id -> engine id
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

    def add(self, request_id: str, token_ids: list[int], sp: SamplingParams) -> asyncio.Queue:
        """Validates (ValueError) and queues a request; returns the queue its deltas arrive on."""
        if self.error is not None:
            raise EngineDead(str(self.error))
        if request_id in self.engine_ids:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.engine.validate(token_ids, sp)
        stream: asyncio.Queue = asyncio.Queue()
        engine_id = f"{next(self.next_id)}:{request_id}"
        self.engine_ids[request_id] = engine_id
        self.streams[engine_id] = stream
        self.inbox.put(("add", engine_id, token_ids, sp))
        self.wakeup.set()
        return stream

    def abort(self, request_id: str) -> bool:
        """Idempotent; the blocks are free before the next step runs."""
        engine_id = self.engine_ids.pop(request_id, None)
        if engine_id is None:
            return False
        self.streams.pop(engine_id, None)
        self.inbox.put(("abort", engine_id))
        self.wakeup.set()
        return True

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
                _, request_id, token_ids, sp = msg
                try:
                    self.engine.add_request(token_ids, sp, request_id)
                except ValueError as e:  # raced with an abort of the same id, or re-validation
                    logger.warning("request %s refused by the engine: %s", request_id, e)
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
            self.error = exc
            self.loop.call_soon_threadsafe(self.fail, exc)

    # ---- event loop -----------------------------------------------------------------------------

    def _dispatch(self, deltas: list[tuple[str, TokenDelta]]) -> None:
        for engine_id, delta in deltas:
            stream = self.streams.get(engine_id)
            if stream is None:
                continue  # aborted meanwhile
            stream.put_nowait(delta)
            if delta.seq is not None:
                del self.streams[engine_id]
                self.engine_ids.pop(engine_id.split(":", 1)[1], None)
                self.num_finished += 1

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        for stream in self.streams.values():
            stream.put_nowait(EngineDead(str(exc)))
        self.streams.clear()
        self.engine_ids.clear()
        self.on_fatal(exc)

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the recent steps."""
        samples = [s for s in self.history if s[0] > time.monotonic() - 10.0]
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0.0, 0.0
        dt = samples[-1][0] - samples[0][0]
        return (samples[-1][1] - samples[0][1]) / dt, (samples[-1][2] - samples[0][2]) / dt


__all__ = ["AsyncEngine", "TokenDelta", "EngineDead", "FinishReason"]
