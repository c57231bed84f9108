"""The frontend's connection to the worker: one gRPC channel, the model info the worker reported,
a watcher that re-fetches it whenever the connection drops (driving the frontend's health), and the
Session stream that carries every request.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from nanoserve.errors import FailedPrecondition, Unavailable
from nanoserve.frontend.worker_session import WorkerSession
from nanoserve.grpc_options import channel_options
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

logger = logging.getLogger(__name__)

RETRY_INTERVAL_S = 0.5


class WorkerLink:
    """Holds the channel to the worker and its WorkerServiceGetModelInfoResponse.

    `on_ready_change(ready)` is awaited whenever the worker becomes usable (answered GetModelInfo
    with a tokenizer digest equal to ours) or stops being usable (connection lost, mismatch).
    """

    def __init__(
        self,
        address: str,
        tokenizer_digest: str,
        on_ready_change: Callable[[bool], Awaitable[None]],
        connect_timeout_s: float = 1.0,
        max_message_bytes: int = 16 * 1024 * 1024,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """`credentials`: TLS to the worker (nanoserve.security.channel_credentials), None for
        plaintext."""
        self.address = address
        self._digest = tokenizer_digest
        self._on_ready_change = on_ready_change
        self._connect_timeout_s = connect_timeout_s
        options = channel_options(max_message_bytes)
        self.channel = (
            grpc.aio.insecure_channel(address, options=options)
            if credentials is None
            else grpc.aio.secure_channel(address, credentials, options=options)
        )
        self.stub = worker_grpc.WorkerServiceStub(self.channel)
        self.session = WorkerSession(self.stub)
        self.info: worker_pb2.WorkerServiceGetModelInfoResponse | None = None
        self._mismatch: str | None = None
        self._ready = False
        self._watcher: asyncio.Task | None = None

    def start(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name="worker-link")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self.session.close()
        await self.channel.close()

    def ready_info(self) -> worker_pb2.WorkerServiceGetModelInfoResponse:
        """The worker's model info; raises UNAVAILABLE or FAILED_PRECONDITION when not usable."""
        if self._mismatch is not None:
            raise FailedPrecondition(self._mismatch)
        if not self._ready or self.info is None:
            raise Unavailable(f"worker at {self.address} is not ready")
        return self.info

    async def check_connected(self) -> None:
        """Fails fast (UNAVAILABLE) when the worker cannot be reached, instead of letting a call
        wait for a connection until its deadline."""
        state = self.channel.get_state(try_to_connect=True)
        if state == grpc.ChannelConnectivity.READY:
            return
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise Unavailable(f"worker at {self.address} is unreachable")
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self._connect_timeout_s)
        except TimeoutError:
            raise Unavailable(
                f"worker at {self.address} did not connect within {self._connect_timeout_s} s"
            ) from None

    async def _set_ready(self, ready: bool) -> None:
        if ready != self._ready:
            self._ready = ready
            await self._on_ready_change(ready)

    async def _refresh(self) -> bool:
        try:
            info = await self.stub.GetModelInfo(
                worker_pb2.WorkerServiceGetModelInfoRequest(), timeout=self._connect_timeout_s * 5
            )
        except grpc.aio.AioRpcError as e:
            if self._ready:
                logger.warning("worker at %s lost: %s", self.address, e.code().name)
            await self._set_ready(False)
            return False
        self.info = info
        if not info.tokenizer_digest and not self._ready:
            logger.warning(
                "worker at %s reports no tokenizer digest: cannot check that it uses "
                "the frontend's tokenizer files",
                self.address,
            )
        if info.tokenizer_digest and info.tokenizer_digest != self._digest:
            if self._mismatch is None:
                logger.error(
                    "worker at %s serves %s with tokenizer digest %s, but the frontend's "
                    "tokenizer files hash to %s: not serving until they match",
                    self.address,
                    info.model_name,
                    info.tokenizer_digest,
                    self._digest,
                )
            self._mismatch = (
                f"the worker's tokenizer (digest {info.tokenizer_digest[:12]}) "
                f"differs from the frontend's ({self._digest[:12]})"
            )
            await self._set_ready(False)
            return True
        if not self._ready:
            logger.info(
                "worker at %s ready: model %s, max_model_len %d, vocab_size %d, tp %d",
                self.address,
                info.model_name,
                info.max_model_len,
                info.vocab_size,
                info.tensor_parallel_size,
            )
        self._mismatch = None
        await self._set_ready(True)
        return True

    async def _watch(self) -> None:
        """Polls GetModelInfo until the worker answers, then sleeps until the connection leaves
        READY (worker restart, network) and starts over, so a restarted worker's info is used."""
        while True:
            if not await self._refresh():
                await asyncio.sleep(RETRY_INTERVAL_S)
                continue
            state = self.channel.get_state()
            if state != grpc.ChannelConnectivity.READY:
                await asyncio.sleep(RETRY_INTERVAL_S)
                continue
            while state == grpc.ChannelConnectivity.READY:
                await self.channel.wait_for_state_change(state)
                state = self.channel.get_state()
