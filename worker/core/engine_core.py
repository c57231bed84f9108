"""The engine core process: owns LLMEngine (and its tensor-parallel ranks) and busy-loops over steps.

worker.service.server (gRPC, asyncio) <-- core.frames over a pipe --> run_engine_core (this process).
In: batches of adds and aborts. Out: one Step frame per engine step with every request's new ids, so
the engine never waits for an event loop, protobuf or gRPC.
"""

import logging
import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection

from nanoserve.sampling import SamplingParams
from nanoserve.startup_heap import freeze_startup_heap
from nanoserve.tracing import tracer_for
from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.core.frame_io import FrameReader, FrameWriter, name_os_thread
from nanoserve.worker.core.frames import (
    Add,
    Alive,
    CoreFrame,
    Error,
    Finish,
    Invalid,
    LoadFrame,
    Output,
    Ready,
    Refused,
    Step,
    encode,
    read_inbox,
)
from nanoserve.worker.core.sequence_trace import trace_sequence
from nanoserve.worker.core.stats_log import Load, StatsLogger
from nanoserve.worker.runner.serving_stalls import log_serving_stalls

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # between Alive frames
FLUSH_S = 5.0  # how long a core that exits waits for its last frames to be written


class EngineCore:
    """The engine's side of the pipe: applies adds/aborts between steps, sends one frame per step."""

    def __init__(self, config: WorkerConfig, inbox: Connection, outbox: Connection):
        from nanoserve.worker.core.llm_engine import LLMEngine

        self.engine = LLMEngine(config)
        self.engine.model_runner.on_rank_death = self.die  # tensor parallel: a dead rank
        self.exiting = False
        self.load_dirty = True
        self.stats = StatsLogger(config.stats_interval_s)
        self.step_started: float | None = None  # time.monotonic() while a step runs
        # the pipes are read and written by threads (frame_io): the step loop never blocks on one
        self.inbox = FrameReader(inbox, "core-inbox")
        self.outbox = FrameWriter(outbox, "core-outbox")
        threading.Thread(target=self._heartbeat, name="core-heartbeat", daemon=True).start()
        # tracing on: the traced requests' parent spans (the worker gRPC process's), by engine id
        self.tracer = tracer_for("nanoserve-engine-core", config.otlp_traces_endpoint)
        self.traced: dict[int, str] = {}

    def send(self, frame: CoreFrame) -> None:
        self.outbox.send_bytes(encode(frame))  # thread-safe: the TP watcher may send ERROR

    def _heartbeat(self) -> None:
        name_os_thread()
        while True:
            started = self.step_started
            running = 0.0 if started is None else time.monotonic() - started
            try:
                self.send(Alive(running))
            except OSError:  # the server is gone
                return
            time.sleep(HEARTBEAT_S)

    def info(self) -> dict:
        e = self.engine
        return {
            "max_model_len": e.max_model_len,
            "vocab_size": e.model_config.vocab_size,
            "eos_token_ids": list(e.eos_token_ids),
            "block_size": e.block_size,
            "num_kvcache_blocks": e.num_kvcache_blocks,
            "max_num_seqs": e.config.max_num_seqs,
            "dtype": str(e.model_runner.dtype).removeprefix("torch."),
            "device": str(e.model_runner.device),
        }

    def load(self) -> Load:
        return Load.of(self.engine)

    def apply(self, data: bytes) -> None:
        inbox = read_inbox(data)
        for add in map(Add._make, inbox.adds):
            try:
                self.engine.add_request(
                    add.token_ids,
                    SamplingParams.trusted(add.params),
                    add.engine_id,  # the core names requests by int engine ids
                    cache_salt=add.cache_salt,
                    priority=add.priority,
                )
            except ValueError as e:  # an engine id already running: a bug, but one stream's
                logger.warning("request %s refused by the engine: %s", add.engine_id, e)
                self.send(Refused(add.engine_id, str(e)))
                continue
            if add.traceparent is not None and self.tracer is not None:
                self.traced[add.engine_id] = add.traceparent
        aborts, completion_aborts, exit_ = inbox.aborts, inbox.completion_aborts, inbox.exit
        for engine_id in aborts:  # after the adds: a frame may add a request and abort it
            if engine_id in self.traced:
                self._trace_abort(engine_id)
            self.engine.abort(engine_id)
        for engine_id, index in completion_aborts:
            self.engine.abort_completion(engine_id, index)
        self.exiting = self.exiting or exit_
        self.load_dirty = True

    def run(self) -> None:
        """Until the server says exit (or closes the pipe): drain the inbox, step, send outputs."""
        engine = self.engine
        while not self.exiting:
            idle = engine.is_finished()
            if idle and self.load_dirty:  # GetLoad sees blocks freed by aborts while idle
                self.send(LoadFrame(self.load()))
                self.load_dirty = False
            # idle: block until the server sends something (or the stats line is due); busy: only
            # take what is there
            timeout = self.stats.idle_wait_s() if idle else 0
            while True:
                try:
                    data = self.inbox.get(timeout)
                except queue.Empty:
                    break
                if data is None:  # the server is gone
                    return
                self.apply(data)
                timeout = 0
            if engine.is_finished():
                self.stats.observe(self.load())  # the last window of a burst of work
                continue
            self.stats.begin(self.load)  # a load report only when a window opens
            started = time.perf_counter()
            self.step_started = time.monotonic()
            outputs = engine.step()
            self.step_started = None
            step_s = time.perf_counter() - started
            out, cached = self._outputs(outputs)
            if self.traced:
                self._trace(outputs)
            load = self.load()
            self.send(Step(load, out, step_s, cached))
            self.load_dirty = False
            self.stats.observe(load)

    def _outputs(self, outputs: list) -> tuple[list[Output], list[list[int]]]:
        """A step's outputs as frames.Output, and [engine id, cached prompt tokens] of the
        sequences whose first output this is; a sequence that failed gets an Invalid frame."""
        out, cached = [], []
        for o in outputs:
            seq = o.seq
            engine_id: int = seq.request_id  # type: ignore[assignment]  # the core's ids are ints
            if seq.error is not None:  # a grammar that does not compile
                self.send(Invalid(engine_id, seq.error))
                continue
            finish = _finish(seq) if o.finished else None
            out.append(
                (engine_id, o.new_token_ids, finish, seq.index, o.logprobs, o.prompt_logprobs)
            )
            if not o.finished and 0 < len(o.new_token_ids) == seq.num_completion_tokens:
                cached.append([engine_id, seq.num_cached_tokens])
        return out, cached

    def _trace(self, outputs: list) -> None:
        """The spans of the traced sequences that ended in this step."""
        assert self.tracer is not None
        for o in outputs:
            if not o.finished:
                continue
            parent = self.traced.get(o.seq.request_id)
            if parent is not None:
                trace_sequence(self.tracer, parent, o.seq)
                if o.seq.request_id not in self.engine.requests:  # its last completion
                    del self.traced[o.seq.request_id]

    def _trace_abort(self, engine_id: int) -> None:
        """The spans of a traced request's open sequences, ended early by its caller."""
        assert self.tracer is not None
        parent = self.traced.pop(engine_id)
        seq = self.engine.requests.get(engine_id)
        for s in (seq.group or (seq,)) if seq is not None else ():
            if not s.is_finished:
                trace_sequence(self.tracer, parent, s, aborted=True)

    def die(self, message: str) -> None:
        """Fatal: tell the server why, stop the ranks, exit non-zero without teardown."""
        try:
            self.send(Error(message))
            self.outbox.flush(FLUSH_S)
        except OSError:
            pass
        logging.shutdown()
        self.engine.model_runner.kill()
        os._exit(1)


def _finish(seq) -> Finish:
    return Finish(
        seq.finish_reason.value,
        seq.num_prompt_tokens,
        seq.num_completion_tokens,
        seq.num_cached_tokens,
        seq.stop_token_id,
        *seq.timings(),
    )


def run_engine_core(config: WorkerConfig, inbox: Connection, outbox: Connection) -> None:
    """Entry point of the engine core process (spawned by worker.service.server from its main thread)."""
    # SIGTERM/SIGINT go to the server, which drains and then says exit; the ranks this process
    # spawns inherit the ignored dispositions
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.device == "cpu":
        # before torch loads OpenMP: idle OpenMP threads that spin steal the cores the gRPC process
        # and the frontend need (measured on a busy 2-core box: a CPU step 3-10x slower)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from nanoserve.worker.tp.rank import die_with_parent

    die_with_parent()  # a SIGKILLed server leaves no engine behind
    from nanoserve.log import setup_logging

    setup_logging("worker", config.log_level)
    try:
        core = EngineCore(config, inbox, outbox)
    except BaseException as exc:
        # the server logs the one line that says why; the traceback only at DEBUG
        logger.debug("loading the engine failed", exc_info=True)
        outbox.send_bytes(encode(Error(f"loading the engine failed: {exc}")))
        logging.shutdown()
        os._exit(1)
    freeze_startup_heap("engine core")  # the model's and torch's objects: the stepping process
    log_serving_stalls()  # from here a compile or a long GC pass holds every stream: say so
    core.send(Ready(core.info()))
    if config.engine_core_cpus:  # the pipe and heartbeat threads run: they stay off these CPUs
        from nanoserve.worker.config import parse_cpu_list
        from nanoserve.worker.core.cpu_affinity import pin_step_loop

        pin_step_loop(parse_cpu_list(config.engine_core_cpus))
    try:
        core.run()
    except BaseException as exc:
        logger.exception("engine step failed")
        core.die(str(core.engine.model_runner.explain(exc)))
    core.engine.shutdown()  # between steps: no step is running now
    if core.tracer is not None:
        core.tracer.shutdown()  # exports the spans it holds
    core.outbox.flush(FLUSH_S)
    logging.shutdown()
    os._exit(0)
