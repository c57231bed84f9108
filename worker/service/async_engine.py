"""The gRPC process's handle on the engine core process (worker.core.engine_core): spawns it, sends it
adds and aborts in batches, and fans each step's frame out to the requests' streams
(worker.service.output_stream).
"""

import asyncio
import collections
import itertools
import logging
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Protocol

from nanoserve.sampling import Limits, SamplingParams
from nanoserve.tracing import Tracer, tracer_for
from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.core import engine_core, frames
from nanoserve.worker.core.frame_io import FrameWriter
from nanoserve.worker.core.frames import Finish
from nanoserve.worker.core.stats_log import Load
from nanoserve.worker.service.output_stream import Collector, Completion, Stream
from nanoserve.worker.service.request_trace import end_request_span, start_request_span

logger = logging.getLogger(__name__)


class EngineDead(RuntimeError):
    """The engine core process failed or died; every stream ends with this error."""


class RequestAborted(RuntimeError):
    """The request was ended by WorkerService.Abort or refused by the engine."""


class RequestInvalid(ValueError):
    """The engine found a field invalid after admission (a grammar that does not compile); the
    message names the field."""


class StepObserver(Protocol):
    """What the engine's histograms take (metrics.EngineHistograms; a protocol keeps metrics -> here
    the only import between the two modules)."""

    def observe_step(self, num_seqs: int, num_tokens: int, step_s: float) -> None: ...

    def observe_finish(self, finish: Finish) -> None: ...


class AsyncEngine:
    tracer: Tracer | None = None  # tracing on: a span per request (nanoserve.tracing)

    def __init__(
        self,
        config: WorkerConfig,
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[BaseException], None],
    ):
        self.config, self.loop, self.on_fatal = config, loop, on_fatal
        ctx = mp.get_context("spawn")  # CUDA; called from the main thread (PDEATHSIG is per thread)
        core_in, to_core = ctx.Pipe(duplex=False)
        self.from_core, core_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=engine_core.run_engine_core,
            name="nanoserve-engine-core",
            args=(config, core_in, core_out),
        )
        self.process.start()
        core_in.close()  # our copies: the core's death must read as EOF here
        core_out.close()
        # written by a thread (frame_io): a large frame never blocks this event loop, whatever
        # the core is doing (its own thread drains the pipe)
        self.to_core = FrameWriter(to_core, "to-core")
        self.last_alive = loop.time()  # the core's last heartbeat (frames.Alive)
        self.step_running_s = 0.0  # how long the core's current step had run at that heartbeat
        self.ready: asyncio.Future = loop.create_future()  # the model info, once loaded
        self.info: dict = {}
        # what requests are checked against (request_proto.admit): the core reports them once
        # its model loaded
        self.limits = Limits(max_model_len=0, vocab_size=0)
        self.streams: dict[int, Stream] = {}  # engine id -> stream
        self.by_request_id: dict[str, Stream] = {}  # the caller's id -> stream (GenerateTokens)
        self.next_id = itertools.count()
        self.adds: list[frames.Add] = []
        self.aborts: list[int] = []
        self.completion_aborts: list[list[int]] = []  # [engine id, completion index]
        self.flush_scheduled = False
        self.error: BaseException | None = None
        self.stopping = False  # the core was told to exit: its EOF is no failure
        self.num_finished = 0
        self.histograms: StepObserver | None = None  # set when /metrics is served
        self.load = Load(time.monotonic(), 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0)  # the core's latest
        # (time, prompt tokens done, generated tokens) samples for the rates in GetLoad
        self.history: collections.deque = collections.deque(maxlen=64)
        self.handlers: dict[type, Callable] = {
            frames.Ready: self._on_ready,
            frames.Alive: self._on_alive,
            frames.LoadFrame: self._on_load,
            frames.Step: self._on_step,
            frames.Refused: self._on_refused,
            frames.Invalid: self._on_invalid,
            frames.Error: self._on_error,
        }
        loop.add_reader(self.from_core.fileno(), self._on_readable)
        # the engine core's spans are children of these
        self.tracer = tracer_for("nanoserve-worker", config.otlp_traces_endpoint)

    @property
    def num_requests(self) -> int:
        return len(self.streams)

    def add(
        self,
        request_id: str,
        token_ids: list[int],
        sp: SamplingParams,
        owner: Collector | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        traceparent: str | None = None,
    ) -> Stream:
        """Queues a request that service.admission.admit checked. Without an owner (a Session's),
        it gets a Collector of its own and its request id is unique among such requests
        (WorkerService.Abort names them). `cache_salt`: prefix-cache isolation
        (LLMEngine.add_request). `traceparent`: the caller's span (tracing.traceparent_from)."""
        if self.error is not None:
            raise EngineDead(str(self.error))
        if owner is None and request_id in self.by_request_id:
            raise ValueError(f"request_id: {request_id!r} is already running")
        stream = Stream(request_id, next(self.next_id), owner or Collector())
        stream.completions += [Completion() for _ in range(sp.n - 1)]
        self.streams[stream.engine_id] = stream
        if owner is None:
            self.by_request_id[request_id] = stream
        core_parent = None
        if self.tracer is not None:
            stream.span = start_request_span(
                self.tracer, request_id, len(token_ids), sp.n, traceparent
            )
            core_parent = stream.span.traceparent  # the engine core's span: a child of this one
        self.adds.append(
            frames.Add(
                stream.engine_id,
                token_ids,
                sp.as_fields(),
                cache_salt or None,
                priority,
                core_parent,
            )
        )
        self._schedule_flush()
        return stream

    def abort(self, request_id: str) -> bool:
        """WorkerService.Abort: ends the request's stream (RequestAborted). Idempotent."""
        stream = self.by_request_id.get(request_id)
        if stream is None:
            return False
        self.abort_stream(stream)
        return True

    def abort_stream(self, stream: Stream) -> None:
        """Ends a live stream with RequestAborted (an operator's Abort) and frees its blocks."""
        self.release(stream)
        self._end(stream, RequestAborted(f"request {stream.request_id!r} was aborted"))

    def release(self, stream: Stream) -> None:
        """Forget a stream that ends early (cancelled, deadline, error, abort); the engine frees its
        blocks before its next step. Idempotent."""
        if self.streams.pop(stream.engine_id, None) is None:
            return
        if self.by_request_id.get(stream.request_id) is stream:
            del self.by_request_id[stream.request_id]
        end_request_span(stream, aborted=True)
        self.aborts.append(stream.engine_id)
        self._schedule_flush()

    def abort_completion(self, stream: Stream, index: int) -> bool:
        """Ends completion `index` of a live n > 1 stream without output (its consumer matched a
        stop string in it); the engine frees its blocks before its next step and the others go
        on. Ending the last open completion releases the stream. False when there is nothing to
        end: an unknown stream, an index out of range, a completion that ended."""
        if self.streams.get(stream.engine_id) is not stream:
            return False
        if not 0 <= index < len(stream.completions):
            return False
        completion = stream.completions[index]
        if completion.finish is not None or completion.aborted:
            return False
        completion.aborted = True
        completion.ids, completion.logprobs, completion.prompt_logprobs = [], None, None
        stream.num_finished += 1
        if stream.finished:  # nothing left to run: the whole request ends
            self.release(stream)
            return True
        self.completion_aborts.append([stream.engine_id, index])
        self._schedule_flush()
        return True

    def _schedule_flush(self) -> None:
        # everything queued in this pass of the event loop goes to the core in one frame
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self, exit_: bool = False) -> None:
        self.flush_scheduled = False
        if self.error is not None:
            return
        if not (self.adds or self.aborts or self.completion_aborts or exit_):
            return
        adds, self.adds, aborts, self.aborts = self.adds, [], self.aborts, []
        completion_aborts, self.completion_aborts = self.completion_aborts, []
        try:
            frame = frames.inbox_frame(adds, aborts, exit_, completion_aborts)
        except (TypeError, ValueError) as e:  # a value msgpack cannot carry: a bug, but one that
            # must end these requests with an error rather than leave their streams hanging
            logger.error("requests could not be sent to the engine core: %s", e)
            for engine_id, *_ in adds:
                self._on_refused(frames.Refused(engine_id, f"could not be sent to the core: {e}"))
            frame = frames.inbox_frame([], aborts, exit_, completion_aborts)
        try:
            self.to_core.send_bytes(frame)
        except OSError as e:  # the core is gone; the reader sees EOF and fails the streams
            logger.warning("engine core unreachable: %s", e)

    # ---- frames from the core --------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            while self.from_core.poll(0):
                frame = frames.decode(self.from_core.recv_bytes())
                self.handlers[type(frame)](frame)
        except (EOFError, OSError):
            self.loop.remove_reader(self.from_core.fileno())
            if self.stopping:
                return
            self.process.join(timeout=1.0)
            self.fail(
                EngineDead(f"the engine core process died (exit code {self.process.exitcode})")
            )

    def _on_ready(self, frame: frames.Ready) -> None:
        self.info = info = frame.info
        self.limits = Limits(
            max_model_len=info["max_model_len"],
            vocab_size=info["vocab_size"],
            eos_token_ids=tuple(info.get("eos_token_ids", ())),
            max_num_seqs=info.get("max_num_seqs"),
            max_stop_token_ids=self.config.max_stop_token_ids,
        )
        self.ready.set_result(info)

    def _on_alive(self, frame: frames.Alive) -> None:
        self.last_alive, self.step_running_s = self.loop.time(), frame.step_running_s

    def stalled_s(self) -> float:
        """How long the core has shown no progress: its current step's run time, or the silence
        since its last heartbeat when that is longer (a frozen process sends none)."""
        return self.loop.time() - self.last_alive + self.step_running_s

    def _on_load(self, frame: frames.LoadFrame | frames.Step) -> None:
        self.load = Load._make(frame.load)
        self.history.append(frame.load[:3])

    def _on_step(self, frame: frames.Step) -> None:
        previous = self.load
        self._on_load(frame)
        outputs = frame.outputs
        histograms = self.histograms
        if histograms is not None:  # a few observations per step, none per token
            current = self.load
            histograms.observe_step(
                len(outputs),
                current.num_prompt_tokens
                - previous.num_prompt_tokens
                + current.num_generated_tokens
                - previous.num_generated_tokens,
                frame.step_s,
            )
        streams, touched = self.streams, set()
        for engine_id, num_cached in frame.cached:
            stream = streams.get(engine_id)
            if stream is not None and stream.cached_tokens is None:
                stream.cached_tokens = num_cached
        for engine_id, ids, finish, index, logprobs, prompt_logprobs in outputs:  # frames.Output
            stream = streams.get(engine_id)
            if stream is None:
                continue  # ended meanwhile
            completion = stream.completions[index]
            if completion.aborted:
                continue  # its consumer ended it; counted as finished then
            completion.ids += ids
            if logprobs is not None or prompt_logprobs is not None:
                completion.add_logprobs(logprobs, prompt_logprobs)
            if finish is not None:
                completion.finish = Finish._make(finish)
                stream.num_finished += 1
                if histograms is not None:
                    histograms.observe_finish(completion.finish)
                if stream.finished:
                    self._forget(stream)
                    self.num_finished += 1
            stream.owner.ready[engine_id] = stream
            touched.add(stream.owner)
        for owner in touched:
            owner.event.set()

    def _on_refused(self, frame: frames.Refused) -> None:
        stream = self.streams.get(frame.engine_id)
        if stream is not None:
            self._forget(stream, frame.reason)
            self._end(stream, RequestAborted(f"refused by the engine: {frame.reason}"))

    def _on_invalid(self, frame: frames.Invalid) -> None:
        stream = self.streams.get(frame.engine_id)
        if stream is not None:
            self._forget(stream, frame.reason)
            self._end(stream, RequestInvalid(frame.reason))

    def _on_error(self, frame: frames.Error) -> None:
        self.fail(EngineDead(frame.message))

    def _forget(self, stream: Stream, error: str | None = None) -> None:
        """The stream ended in the core (finished, refused, invalid: `error` says why)."""
        end_request_span(stream, error=error)
        del self.streams[stream.engine_id]
        if self.by_request_id.get(stream.request_id) is stream:
            del self.by_request_id[stream.request_id]

    def _end(self, stream: Stream, error: Exception) -> None:
        stream.error = error
        stream.owner.notify(stream)

    def fail(self, exc: BaseException) -> None:
        """The engine is dead (a step raised, a rank or the core process died)."""
        if self.error is not None:
            return
        self.error = exc
        logger.error("engine failed: %s", exc)
        if not self.ready.done():
            self.ready.set_exception(exc)
        for stream in list(self.streams.values()):
            end_request_span(stream, error=str(exc))
            self._end(stream, exc if isinstance(exc, Exception) else EngineDead(str(exc)))
        self.streams.clear()
        self.by_request_id.clear()
        self.on_fatal(exc)

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the recent steps."""
        samples = [s for s in self.history if s[0] > time.monotonic() - 10.0]
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0.0, 0.0
        dt = samples[-1][0] - samples[0][0]
        return (samples[-1][1] - samples[0][1]) / dt, (samples[-1][2] - samples[0][2]) / dt

    # ---- shutdown --------------------------------------------------------------------------------

    async def stop(self) -> int:
        """Between steps the core shuts the engine (and its ranks) down and exits; its exit code."""
        self.stopping = True
        if self.error is None:
            self._flush(exit_=True)
        else:
            self.process.kill()
        await asyncio.to_thread(self.process.join)
        self.loop.remove_reader(self.from_core.fileno())
        if self.tracer is not None:
            self.tracer.shutdown()  # exports the spans it holds
        code = self.process.exitcode
        assert code is not None  # joined
        return code

    def kill(self) -> None:
        """Before a fatal exit: the core (and, by PDEATHSIG, its ranks) go without teardown."""
        self.process.kill()
