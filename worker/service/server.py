"""WorkerService over gRPC: token ids in, streams of token-id deltas out, on top of AsyncEngine.

The worker is a trust boundary: it re-validates every request. Health reports NOT_SERVING until the
engine is loaded and while draining; a dead engine makes the process exit non-zero.
"""

import asyncio
import logging
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve.errors import (
    InvalidArgument,
    ServiceError,
    Unavailable,
    echo,
    grpc_errors,
)
from nanoserve.grpc_options import server_options
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.security import ServerSecurity, current_tenant
from nanoserve.startup_heap import freeze_startup_heap
from nanoserve.tracing import traceparent_from, traceparent_in
from nanoserve.wire import MAX_REQUEST_ID_LENGTH
from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.service.admission import add_logprobs, admit, set_finish, stream_error
from nanoserve.worker.service.async_engine import AsyncEngine, EngineDead
from nanoserve.worker.service.load_report import session_load
from nanoserve.worker.service.request_bounds import max_request_bytes
from nanoserve.worker.service.request_log import (
    CANCELLED_BY_CALLER,
    SESSION_ENDED,
    SHUTTING_DOWN,
    log_request_end,
)
from nanoserve.worker.service.session import WorkerSession, run_session

logger = logging.getLogger(__name__)
SERVICE_NAME = "nanoserve.v1.WorkerService"


class WorkerServicer(worker_grpc.WorkerServiceServicer):
    def __init__(self, config: WorkerConfig):
        self.config = config
        self.engine: AsyncEngine | None = None  # set once the model is loaded
        self.draining = False
        # the engine core shows no progress (watch_engine): new work is refused, and the load
        # reports say draining, so frontends send it to other workers until the core recovers
        self.stalled = False
        self.sessions: set[WorkerSession] = set()  # open Session streams, for Abort
        self.histograms = None  # worker.service.metrics.EngineHistograms, when /metrics is served
        self.digest = tokenizer_digest(config.model) if config.model else ""

    @property
    def refusing_work(self) -> bool:
        """Draining or stalled: the load reports say draining, so frontends send new work elsewhere."""
        return self.draining or self.stalled

    def set_stalled(self, stalled: bool) -> None:
        """The watchdog's verdict; the sessions send their frontends a load report now."""
        self.stalled = stalled
        for session in self.sessions:
            session.collector.event.set()

    def _ready(self) -> AsyncEngine:
        if self.engine is None:
            raise Unavailable("the worker is still loading the model")
        if self.draining:
            raise Unavailable("the worker is shutting down")
        if self.stalled:
            raise Unavailable("the worker's engine core shows no progress")
        if self.engine.error is not None:
            raise Unavailable("the engine has failed")
        return self.engine

    @grpc_errors
    async def GenerateTokens(self, request, context):
        """Stream the ids generated for one request; cancelling the call aborts it."""
        request_id = request.request_id or uuid.uuid4().hex
        try:
            if len(request_id) > MAX_REQUEST_ID_LENGTH:
                raise InvalidArgument(
                    f"longer than {MAX_REQUEST_ID_LENGTH} characters", field="request_id"
                )
            engine = self._ready()
            stream = admit(
                engine,
                request,
                request_id,
                self.config.max_queued_requests,
                # the request's field (a frontend's), else the caller's gRPC metadata
                traceparent=traceparent_from(request.traceparent)
                or traceparent_in(context.invocation_metadata()),
            )
            stream.caller = current_tenant()  # only this caller may Abort it
        except ServiceError as e:
            log_request_end(request_id, e.code.name, str(e))
            raise
        ended: tuple[str, str] | None = None  # (code, why) once it ended without finishing
        try:
            while True:
                if not stream.has_output:
                    await stream.owner.event.wait()
                stream.owner.take()  # this one stream: its output is read below
                if stream.error is not None:
                    error = stream_error(stream.error)
                    ended = (error.code.name, str(error))
                    raise error
                # per completion, everything that arrived while the client was slow, in one message
                # (several when its logprob entries pass MAX_LOGPROBS_PER_MESSAGE)
                for taken in (piece for t in stream.take() for piece in t.pieces()):
                    response = worker_pb2.GenerateTokensResponse(
                        token_ids=taken.ids, index=taken.index
                    )
                    add_logprobs(response.logprobs, taken.logprobs)
                    add_logprobs(response.prompt_logprobs, taken.prompt_logprobs)
                    if taken.finish is not None:
                        set_finish(response, taken.finish)
                    yield response
                if stream.finished and not stream.has_output:  # n > 1: all ends were sent
                    return
        finally:
            if not stream.finished:  # cancelled, deadline, error, abort: free the blocks now
                engine.release(stream)
                if ended is None:
                    ended = SHUTTING_DOWN if self.draining else ("CANCELLED", CANCELLED_BY_CALLER)
                log_request_end(request_id, *ended)

    def _session_ended(self) -> tuple[str, str]:
        """(code, why) logged for the requests cut when a Session stream ends."""
        return SHUTTING_DOWN if self.draining else SESSION_ENDED

    @grpc_errors
    async def Session(self, request_iterator, context):
        """Many requests of one frontend on one stream; its end aborts them all (worker.service.session)."""
        session = WorkerSession(
            self._ready(),
            self.config.max_queued_requests,
            self._ready,
            draining=lambda: self.refusing_work,
        )
        session.caller = current_tenant()  # only this caller may Abort its requests
        self.sessions.add(session)
        try:
            async for response in run_session(session, request_iterator, self._session_ended):
                yield response
        finally:
            self.sessions.discard(session)

    @grpc_errors
    async def Abort(self, request, context):
        """Abort requests by id, on GenerateTokens calls and Session streams (where the frontend's
        `id#n` answers to the client's `id`); they end ABORTED. Unknown ids are ignored, and so
        are the requests of another caller (the worker token's name that started them)."""
        engine = self._ready()
        if len(request.request_ids) > self.config.max_queued_requests:  # bounded before walked
            raise InvalidArgument(
                f"more than max_queued_requests ({self.config.max_queued_requests}) ids",
                field="request_ids",
            )
        num_aborted, caller = 0, current_tenant()
        for request_id in request.request_ids:
            stream = engine.by_request_id.get(request_id)
            if stream is not None and stream.caller == caller:
                num_aborted += engine.abort(request_id)
            num_aborted += sum(
                s.abort_by_operator(request_id) for s in self.sessions if s.caller == caller
            )
        if num_aborted:
            logger.info(
                "aborted %d requests by operator: %s",
                num_aborted,
                ", ".join(echo(r) for r in request.request_ids[:8]),
            )
        return worker_pb2.AbortResponse(num_aborted=num_aborted)

    @grpc_errors
    async def GetModelInfo(self, request, context):
        """The limits a frontend validates against."""
        info = self._ready().info
        return worker_pb2.WorkerServiceGetModelInfoResponse(
            model_name=Path(self.config.model).name,
            max_model_len=info["max_model_len"],
            vocab_size=info["vocab_size"],
            eos_token_ids=info["eos_token_ids"],
            kvcache_block_size=info["block_size"],
            num_kvcache_blocks=info["num_kvcache_blocks"],
            tensor_parallel_size=self.config.tensor_parallel_size,
            tokenizer_digest=self.digest,
            max_num_seqs=self.config.max_num_seqs,
            max_stop_token_ids=self.config.max_stop_token_ids,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            dtype=info["dtype"],
            device=info["device"],
        )

    @grpc_errors
    async def GetLoad(self, request, context):
        """Queue lengths, KV blocks, prefix-cache hit rate and recent throughput, as of the engine
        core's latest frame (sent every step, and when it goes idle). It still answers while the
        worker drains (draining=true), so a frontend tells "finishing, take no new requests" from
        "gone"."""
        a = self.engine
        if a is None:
            raise Unavailable("the worker is still loading the model")
        if a.error is not None:
            raise Unavailable("the engine has failed")
        report = session_load(a.load, self.refusing_work)  # plus what only GetLoad says:
        report.prompt_tokens_per_s, report.generation_tokens_per_s = a.rates()
        report.num_finished = a.num_finished
        return report


async def watch_engine(
    engine: AsyncEngine,
    timeout_s: float,
    health_servicer: health.aio.HealthServicer,
    on_fatal: Callable[[BaseException], None],
    stop: asyncio.Event,
    on_stalled: Callable[[bool], None] = lambda stalled: None,
) -> None:
    """A stuck engine core made visible: NOT_SERVING once it has shown no progress for half of
    timeout_s (SERVING again if it recovers), told to `on_stalled` (the servicer then refuses new
    work and its load reports say draining: frontends route around it), a fatal exit (non-zero: a
    supervisor restarts the worker) after all of it. A slow step is progress the heartbeat
    reports, so the bound is
    generous: a step of seconds is normal on CPU, a stall of minutes is not."""
    if timeout_s <= 0:
        return
    serving = True
    while not stop.is_set():
        await asyncio.sleep(min(1.0, timeout_s / 4))
        stalled = engine.stalled_s()
        if stalled >= timeout_s:
            logger.error("the engine core showed no progress for %.0f s: exiting", stalled)
            on_fatal(EngineDead(f"engine core stalled for {stalled:.0f} s"))
            return
        if serving == (stalled >= timeout_s / 2):
            serving = not serving
            if serving:
                logger.warning("the engine core makes progress again: SERVING")
            else:
                logger.error("the engine core shows no progress for %.0f s: NOT_SERVING", stalled)
            on_stalled(not serving)
            status = health_pb2.HealthCheckResponse
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, status.SERVING if serving else status.NOT_SERVING)


async def serve(config: WorkerConfig) -> int:
    """Run the worker until SIGTERM/SIGINT (exit 0) or an engine failure (exit 1)."""
    loop = asyncio.get_running_loop()
    too_large = max_request_bytes(config.max_model_len, config.max_stop_token_ids)
    # the frontend link: a shared secret (bearer metadata, checked before a request is parsed)
    # and/or TLS, mutual with a client CA
    security = ServerSecurity.load(
        config.tls_cert_file,
        config.tls_key_file,
        config.tls_client_ca_file,
        api_keys_file=config.auth_token_file,
    )
    interceptors = security.interceptors(
        too_large, "5 bytes * (max_model_len + max_stop_token_ids) + 397 KiB"
    )
    server = grpc.aio.server(
        interceptors=interceptors, options=server_options(config.max_message_bytes)
    )
    servicer = WorkerServicer(config)
    worker_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    port = security.add_port(server, config.host, config.port)
    if port == 0:
        raise ValueError(f"port: cannot bind {config.host}:{config.port}")
    await server.start()
    print(f"worker listening on {config.host}:{port}", flush=True)
    if config.metrics_port:  # prometheus_client is imported only when asked for
        from nanoserve.worker.service.metrics import serve_worker_metrics

        serve_worker_metrics(servicer, Path(config.model).name, config.metrics_port, config.host)

    stop = asyncio.Event()
    exit_code = 0

    def on_fatal(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()  # the stuck or dead core is killed below, not waited for

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    # the engine core process loads the model; spawned from this (the main) thread
    engine = AsyncEngine(config, loop, on_fatal)
    waiting = asyncio.ensure_future(stop.wait())
    await asyncio.wait([engine.ready, waiting], return_when=asyncio.FIRST_COMPLETED)
    if not engine.ready.done():
        logger.info("stopped while loading")
        engine.kill()
        await engine.stop()
        await server.stop(0)
        return 0
    waiting.cancel()
    if engine.ready.exception() is not None:  # a load error: the process exits non-zero
        await server.stop(0)
        await engine.stop()
        return 1
    servicer.engine = engine
    engine.histograms = servicer.histograms
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info("serving %s (%d KV blocks)", config.model, engine.info["num_kvcache_blocks"])
    freeze_startup_heap("worker")

    watchdog = asyncio.create_task(
        watch_engine(
            engine,
            config.engine_stall_timeout_s,
            health_servicer,
            on_fatal,
            stop,
            servicer.set_stalled,
        )
    )
    await stop.wait()
    watchdog.cancel()
    servicer.draining = True
    for session in servicer.sessions:  # their frontends learn it from the next load report
        session.collector.event.set()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if exit_code == 0:
        deadline = loop.time() + config.grace_period_s
        while engine.num_requests and loop.time() < deadline:
            await asyncio.sleep(0.05)
        logger.info("draining done (%d streams cut)", engine.num_requests)
    await server.stop(0.5)
    if exit_code:  # the core may be stuck in a collective: do not wait for it
        engine.kill()
        return exit_code
    return 1 if await engine.stop() else 0  # the core shuts the engine down between steps
