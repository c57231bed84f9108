"""Python client of the public FrontendService: `Client` (blocking; `AsyncClient`, its asyncio twin,
lives in shared/client/async_client.py and is importable from here too).

    with Client("127.0.0.1:50051") as client:
        print(client.generate("The capital of France is", max_tokens=16, temperature=0).text)

Failed calls raise the typed errors of shared.errors (InvalidArgument, ResourceExhausted, ...).
TLS: `root_certificates=` (a PEM path or bytes; True for the system's roots), plus `client_cert=`
and `client_key=` for mutual TLS; `token=` sends `authorization: Bearer <token>` on every call.
`connections=N` deals calls over N connections (a server of several processes on one port).
"""

import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.client.async_client import AsyncClient  # noqa: F401 - users import it from here
from nanoserve.client.calls import StreamedCalls
from nanoserve.client.connections import RoundRobin, connection_options
from nanoserve.client.messages import (  # noqa: F401 - also the names users import from here
    DEFAULT_ADDRESS,
    SERVICE_NAME,
    ChatMessages,
    Chunk,
    Completion,
    Detokenized,
    Logprob,
    ModelInfo,
    TokenLogprobs,
    ToolCall,
    Tools,
    Usage,
    _detokenized,
    _model_info,
    join_chunks,
    to_chunk,
)
from nanoserve.client.requests import (  # noqa: F401 - sampling_params: users build one with it
    chat_request,
    detokenize_request,
    generate_request,
    sampling_params,
    tokenize_request,
)
from nanoserve.errors import DeadlineExceeded, ServiceError, error_from_rpc
from nanoserve.grpc_options import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.security import PemSource, bearer_metadata, channel_credentials


class Client(StreamedCalls[Iterator[Chunk]]):
    """Blocking client. `timeout` (seconds) is the default deadline of every call; generate_stream
    and chat_stream are StreamedCalls'."""

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
            grpc.insecure_channel(address, options=options)
            if credentials is None
            else grpc.secure_channel(address, credentials, options=options)
            for _ in range(connections)
        ]
        self._channel = self._channels[0]
        self._stubs = [frontend_grpc.FrontendServiceStub(c) for c in self._channels]
        self._turns = RoundRobin(connections)
        # a blocking channel has no get_state: each one's state as its subscription last told it
        # (the callback runs on a gRPC thread)
        self._states = [grpc.ChannelConnectivity.IDLE] * connections
        if connections > 1:
            for k, channel in enumerate(self._channels):
                channel.subscribe(functools.partial(self._states.__setitem__, k))
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @property
    def _stub(self) -> frontend_grpc.FrontendServiceStub:
        """The next connection's stub (round-robin), passing over connections that are failing."""
        return self._stubs[self._turns.pick(self._states.__getitem__)]

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None

    def _stream(self, method: Any, request: Any, timeout: float | None) -> Iterator[Chunk]:
        call = method(
            request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata
        )
        try:
            for response in call:
                yield to_chunk(response)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        finally:
            call.cancel()  # the caller stopped iterating early: end the request on the server

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """The whole completion of `prompt`; same arguments as generate_stream."""
        return join_chunks(self.generate_stream(prompt, **kwargs))

    def chat(self, messages: ChatMessages, **kwargs: Any) -> Completion:
        """The whole reply to `messages`; same arguments as chat_stream."""
        return join_chunks(self.chat_stream(messages, **kwargs))

    def tokenize(
        self, text: str, add_special_tokens: bool | None = None, timeout: float | None = None
    ) -> list[int]:
        """The token ids of `text` under the served model's tokenizer."""
        request = tokenize_request(text, add_special_tokens)
        return list(self._unary(self._stub.Tokenize, request, timeout).token_ids)

    def detokenize(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool | None = None,
        timeout: float | None = None,
    ) -> Detokenized:
        """The text of `token_ids` under the served model's tokenizer, and each id's own text."""
        request = detokenize_request(token_ids, skip_special_tokens)
        return _detokenized(self._unary(self._stub.Detokenize, request, timeout))

    def model_info(self, timeout: float | None = None) -> ModelInfo:
        """The served model's name and limits."""
        request = frontend_pb2.GetModelInfoRequest()
        return _model_info(self._unary(self._stub.GetModelInfo, request, timeout))

    def health(self, service: str = SERVICE_NAME, timeout: float = 5.0) -> str:
        """The grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._unary(self._health.Check, request, timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_ready(self, timeout: float = 60.0, poll_s: float = 0.1) -> None:
        """Blocks until the frontend reports SERVING (its worker answered); raises
        DeadlineExceeded after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.health(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                if status == "SERVING":
                    return
            except ServiceError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"{self.address} not SERVING after {timeout} s")
            time.sleep(poll_s)
