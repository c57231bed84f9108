"""The frontend's connection to one worker (one of WorkerPool's): its gRPC channel, the Session
stream that carries the requests routed to it and the worker's load reports, and a watcher that
polls GetLoad while no session reports (GetModelInfo on each (re)connect) to keep its state and
load current for routing and the frontend's health.
"""

import asyncio
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from nanoserve.errors import Unavailable
from nanoserve.frontend.workers.routing import WorkerLoad
from nanoserve.frontend.workers.session import Pending, WorkerSession
from nanoserve.grpc_options import channel_options
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 0.25
# A worker's event loop answers GetLoad in milliseconds (the engine runs in its own process); one
# that takes this long is treated as gone.
POLL_TIMEOUT_S = 3.0
# The worker reports its load on an open session at least every second (worker.service.load_report); a
# report older than this means the session stopped reporting: GetLoad is polled again.
SESSION_REPORT_STALE_S = 2.0

ModelInfo = worker_pb2.WorkerServiceGetModelInfoResponse


async def within(awaitable: Awaitable[Any], timeout: float) -> bool:
    """Awaits `awaitable` for at most `timeout` s; True when it finished (its error re-raised).
    Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that races the inner
    result, and a watcher that lost close()'s cancel so kept a frontend alive after SIGTERM."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        task.cancel()
    if done:
        task.result()
    return bool(done)


class LinkState(enum.Enum):
    CONNECTING = "connecting"  # not answered yet
    READY = "ready"  # takes new requests
    DRAINING = "draining"  # finishes its requests, takes no new ones
    UNREACHABLE = "unreachable"  # connection failed, or the worker is loading or failed
    REFUSED = "refused"  # answered with a model or tokenizer other than the frontend's


class WorkerLink:
    """One worker. `vet(info)` returns why a worker's model info is refused (None: accepted);
    `on_change(link)` is called after every state change, each of which is logged once."""

    def __init__(
        self,
        address: str,
        vet: Callable[[ModelInfo], str | None],
        on_change: Callable[["WorkerLink"], None],
        connect_timeout_s: float = 1.0,
        max_message_bytes: int = 16 * 1024 * 1024,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """`credentials`: TLS to the worker (nanoserve.security.channel_credentials), None for
        plaintext; `server_name`: the host name its certificate must carry when `address` is the
        IP address that name resolved to."""
        self.address = address
        self._vet = vet
        self._on_change = on_change
        self._connect_timeout_s = connect_timeout_s
        self._poll_interval_s = poll_interval_s
        options: list[tuple[str, Any]] = list(channel_options(max_message_bytes))
        if credentials is not None and server_name and server_name != address.rpartition(":")[0]:
            options.append(("grpc.ssl_target_name_override", server_name))
        self.channel = (
            grpc.aio.insecure_channel(address, options=options)
            if credentials is None
            else grpc.aio.secure_channel(address, credentials, options=options)
        )
        self.stub = worker_grpc.WorkerServiceStub(self.channel)
        self.metadata = metadata  # the worker link's bearer token, on every worker call
        self.session = WorkerSession(
            self.stub,
            on_broken=self._on_session_broken,
            on_load=self._on_session_load,
            metadata=metadata,
        )
        self.state = LinkState.CONNECTING
        self.reason = ""  # why it is UNREACHABLE or REFUSED
        self.info: ModelInfo | None = None  # re-fetched after every UNREACHABLE
        # the latest load: a session's report or a GetLoad answer
        self.report: worker_pb2.GetLoadResponse | None = None
        self.sent_since_report: set[str] = set()  # ids routed here the report may not count yet
        # ids routed here since the session's latest report: a report is built from the engine's
        # latest frame, that may predate adds on their way, so an id is counted until the next one
        self.sent_since_session_report: set[str] = set()
        self.session_report_at = -math.inf  # loop time of the session's latest report
        self.num_polls = 0  # GetLoad calls made (tests read it)
        self._watcher: asyncio.Task | None = None

    @property
    def usable(self) -> bool:
        return self.state is LinkState.READY

    @property
    def load(self) -> WorkerLoad:
        """The worker's last report plus the requests this frontend sent it since, that still run
        (the report is up to ~50 ms old on a busy session, up to poll_interval_s when polled; a
        burst must not all go to one worker)."""
        pending = self.session.pending
        recent = sum(1 for request_id in self.sent_since_report if request_id in pending)
        r = self.report
        if r is None:  # a worker without GetLoad: only what this frontend sent it
            return WorkerLoad(queue=len(pending), kv_usage=0.0)
        used = r.num_total_blocks - r.num_free_blocks
        return WorkerLoad(
            queue=r.num_running + r.num_waiting + recent,
            kv_usage=used / r.num_total_blocks if r.num_total_blocks else 0.0,
        )

    def start(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name=f"worker-link {self.address}")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.session.close()
        await self.channel.close()

    async def check_connected(self) -> None:
        """Fails fast (UNAVAILABLE) when the worker cannot be reached, instead of letting a call
        wait for a connection until its deadline: a connection attempt that fails ends the wait
        (a worker that just stopped refuses at once; channel_ready() would wait out the timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout_s
        state = self.channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                raise Unavailable(f"worker at {self.address} is unreachable")
            left = deadline - loop.time()
            if left <= 0 or not await within(self.channel.wait_for_state_change(state), left):
                raise Unavailable(
                    f"worker at {self.address} did not connect within {self._connect_timeout_s} s"
                )
            state = self.channel.get_state(try_to_connect=True)

    def start_request(
        self, request: worker_pb2.GenerateTokensRequest, timeout_s: float | None
    ) -> Pending:
        """WorkerSession.start, counted in this worker's load until its next report."""
        self.sent_since_report.add(request.request_id)
        self.sent_since_session_report.add(request.request_id)
        return self.session.start(request, timeout_s)

    def set_state(self, state: LinkState, reason: str = "") -> None:
        """Logs the transition (once: polling the same state again says nothing)."""
        if state is self.state and reason == self.reason:
            return
        before, self.state, self.reason = self.state, state, reason
        if state is before:  # the same state for another reason: no new transition
            return
        if state is LinkState.READY:
            info = self.info
            assert info is not None
            logger.info(
                "worker at %s %s: model %s, max_model_len %d, KV block size %d, tp %d",
                self.address,
                "ready" if before is LinkState.CONNECTING else f"is back (was {before.value})",
                info.model_name,
                info.max_model_len,
                info.kvcache_block_size,
                info.tensor_parallel_size,
            )
        elif state is LinkState.DRAINING:
            logger.warning("worker at %s is draining: no new requests go to it", self.address)
        elif state is LinkState.UNREACHABLE:
            logger.warning(
                "worker at %s is unreachable (%s): no new requests go to it until it answers",
                self.address,
                reason,
            )
        elif state is LinkState.REFUSED:
            logger.error("worker at %s refused: %s", self.address, reason)
        self._on_change(self)

    def _on_session_broken(self, reason: str) -> None:
        # a killed worker is known here at once, before the next poll
        if self.state in (LinkState.READY, LinkState.DRAINING):
            self.info = None
            self.set_state(LinkState.UNREACHABLE, reason)

    def _on_session_load(self, report: worker_pb2.GetLoadResponse) -> None:
        self.report = report
        self.sent_since_report, self.sent_since_session_report = (
            self.sent_since_session_report,
            set(),
        )
        self.session_report_at = asyncio.get_running_loop().time()
        if self.state in (LinkState.READY, LinkState.DRAINING):  # info known: it answered
            self.set_state(LinkState.DRAINING if report.draining else LinkState.READY)

    @property
    def session_reports(self) -> bool:
        """A session is open and its load reports are fresh: no GetLoad poll is needed."""
        age = asyncio.get_running_loop().time() - self.session_report_at
        return self.session.call is not None and age < SESSION_REPORT_STALE_S

    async def _poll(self) -> None:
        timeout = max(POLL_TIMEOUT_S, self._connect_timeout_s)
        try:
            if self.info is None:
                info = await self.stub.GetModelInfo(
                    worker_pb2.WorkerServiceGetModelInfoRequest(),
                    timeout=timeout,
                    metadata=self.metadata,
                )
                refusal = self._vet(info)
                if refusal is not None:
                    self.set_state(LinkState.REFUSED, refusal)
                    return  # info stays None: asked again next time (it may be replaced)
                self.info = info
            try:
                self.num_polls += 1
                self.report = await self.stub.GetLoad(
                    worker_pb2.GetLoadRequest(), timeout=timeout, metadata=self.metadata
                )
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.report = None  # an older worker: routed by prefix alone
            self.sent_since_report = set()
        except grpc.aio.AioRpcError as e:
            self.info = None  # re-fetched when it answers: it may be another worker by then
            self.set_state(LinkState.UNREACHABLE, f"{e.code().name}: {e.details()}")
            return
        draining = self.report is not None and self.report.draining
        self.set_state(LinkState.DRAINING if draining else LinkState.READY)

    async def _watch(self) -> None:
        """Polls every poll_interval_s while no session reports the load (before the first request,
        after a break, a stale report), and at once when the connection changes state (a stopped
        worker's GOAWAY is seen here before the next poll is due)."""
        changed = True
        while True:
            answered = self.state in (LinkState.READY, LinkState.DRAINING)
            if changed or not answered or not self.session_reports:
                await self._poll()
            state = self.channel.get_state()
            changed = await within(self.channel.wait_for_state_change(state), self._poll_interval_s)
