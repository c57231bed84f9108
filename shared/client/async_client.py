"""asyncio client of the public FrontendService (grpc.aio): `AsyncClient`, with the methods of
shared.client's `Client` as coroutines and async iterators, and several connections to one address
(a server of several processes on one port) dealt calls round-robin.
"""

import asyncio
import copy
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.client.calls import StreamedCalls
from nanoserve.client.connections import RoundRobin, connection_options
from nanoserve.client.messages import (
    DEFAULT_ADDRESS,
    SERVICE_NAME,
    ChatMessages,
    Chunk,
    Completion,
    Detokenized,
    ModelInfo,
    _detokenized,
    _model_info,
    join_chunks,
    to_chunk,
)
from nanoserve.client.requests import (
    detokenize_request,
    tokenize_request,
)
from nanoserve.errors import DeadlineExceeded, ServiceError, error_from_rpc
from nanoserve.grpc_options import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.security import PemSource, bearer_metadata, channel_credentials


class AsyncClient(StreamedCalls[AsyncIterator[Chunk]]):
    """asyncio client (grpc.aio); same methods as Client, as coroutines and async iterators."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: float | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        root_certificates: PemSource | bool | None = None,
        client_cert: PemSource | None = None,
        client_key: PemSource | None = None,
        token: str | None = None,
        connections: int = 1,
    ) -> None:
        """`connections`: TCP connections to `address`, calls dealt round-robin over them (a
        server of several processes on one port, SO_REUSEPORT, gets a share of each client)."""
        self.address = address
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        options = connection_options(channel_options(max_message_bytes), connections)
        credentials = channel_credentials(root_certificates, client_cert, client_key)
        self._channels = [
            grpc.aio.insecure_channel(address, options=options)
            if credentials is None
            else grpc.aio.secure_channel(address, credentials, options=options)
            for _ in range(connections)
        ]
        self._channel = self._channels[0]
        self._stubs = [frontend_grpc.FrontendServiceStub(c) for c in self._channels]
        self._turns = RoundRobin(connections)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @property
    def _stub(self) -> frontend_grpc.FrontendServiceStub:
        """The next connection's stub (round-robin), passing over connections that are failing
        (a frontend process restarting): a call there would fail at once while others serve."""
        return self._stubs[self._turns.pick(lambda k: self._channels[k].get_state())]

    def with_token(self, token: str | None) -> "AsyncClient":
        """This client on the same channel, sending `token` instead of its own (a gateway forwards
        each caller's token this way). Closing either closes the shared channel."""
        view = copy.copy(self)
        view._metadata = bearer_metadata(token)
        return view

    def with_metadata(self, metadata: tuple[tuple[str, str], ...]) -> "AsyncClient":
        """This client on the same channel, sending `metadata` with its calls too (a gateway sends
        each request's W3C `traceparent` this way)."""
        view = copy.copy(self)
        view._metadata = (*self._metadata, *metadata)
        return view

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self, timeout: float) -> bool:
        """Opens every connection now rather than on the first calls (a burst would wait for
        them); whether all were ready within `timeout` seconds."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(c.channel_ready() for c in self._channels)), timeout
            )
            return True
        except (asyncio.TimeoutError, grpc.aio.AioRpcError):
            return False

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return await method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from None

    async def _stream(
        self, method: Any, request: Any, timeout: float | None
    ) -> AsyncIterator[Chunk]:
        call = method(
            request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata
        )
        try:
            async for response in call:
                yield to_chunk(response)
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from None
        finally:
            call.cancel()

    async def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        return join_chunks([chunk async for chunk in self.generate_stream(prompt, **kwargs)])

    async def chat(self, messages: ChatMessages, **kwargs: Any) -> Completion:
        return join_chunks([chunk async for chunk in self.chat_stream(messages, **kwargs)])

    async def tokenize(
        self, text: str, add_special_tokens: bool | None = None, timeout: float | None = None
    ) -> list[int]:
        request = tokenize_request(text, add_special_tokens)
        return list((await self._unary(self._stub.Tokenize, request, timeout)).token_ids)

    async def detokenize(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool | None = None,
        timeout: float | None = None,
    ) -> Detokenized:
        request = detokenize_request(token_ids, skip_special_tokens)
        return _detokenized(await self._unary(self._stub.Detokenize, request, timeout))

    async def model_info(self, timeout: float | None = None) -> ModelInfo:
        request = frontend_pb2.GetModelInfoRequest()
        return _model_info(await self._unary(self._stub.GetModelInfo, request, timeout))

    async def health(self, service: str = SERVICE_NAME, timeout: float = 5.0) -> str:
        """The frontend's health, asked on the first connection."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._unary(self._health.Check, request, timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def wait_ready(self, timeout: float = 60.0, poll_s: float = 0.1) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                status = await self.health(timeout=max(0.1, min(1.0, deadline - loop.time())))
                if status == "SERVING":
                    return
            except ServiceError:
                pass
            if loop.time() >= deadline:
                raise DeadlineExceeded(f"{self.address} not SERVING after {timeout} s")
            await asyncio.sleep(poll_s)
