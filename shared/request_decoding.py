"""A server interceptor both services install first: request bytes that do not parse as the method's
message end the call with INVALID_ARGUMENT and one log line, before any servicer code runs.

Without it grpc answers UNKNOWN, with the Python exception's class in the details and an ERROR
traceback in the log for every such call: a cheap way for a client to flood the logs. With
`max_request_bytes`, a request larger than any valid one is refused unparsed (parsing 15 MB of
token ids holds the event loop for ~100 ms).
"""

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

logger = logging.getLogger(__name__)


class Undecodable:
    """Stands in for a request whose bytes did not parse; the wrapped handler refuses it."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(
    deserializer: Callable[[bytes], Any] | None, max_bytes: int | None, hint: str
) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        if max_bytes is not None and len(data) > max_bytes:
            return Undecodable(f"{len(data)} bytes, more than any valid request ({hint})")
        try:
            return deserializer(data)
        except Exception as e:  # noqa: BLE001 - DecodeError, or anything a parser raises
            return Undecodable(type(e).__name__)

    return deserialize


async def refuse(method: str, request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    """Ends the call with INVALID_ARGUMENT and logs one line (raises grpc.aio.AbortError)."""
    logger.warning(
        "%s from %s: request refused before its handler: %s", method, context.peer(), request.reason
    )
    message = f"request: not a valid {method} message: {request.reason}"
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def _guard(
    method: str, handler: grpc.RpcMethodHandler, max_bytes: int | None, hint: str
) -> grpc.RpcMethodHandler:
    """The handler with a deserializer that never raises, and a behaviour that refuses what it
    could not parse. A behaviour marked `refuses_undecodable` (errors.grpc_errors does it) keeps
    its place: no extra layer per streamed message. Only unary-request async handlers change."""
    deserialize = _tolerant(handler.request_deserializer, max_bytes, hint)
    serializer = handler.response_serializer
    if handler.request_streaming or deserialize is None:
        return handler
    own = handler.unary_stream if handler.response_streaming else handler.unary_unary
    make = (
        grpc.unary_stream_rpc_method_handler
        if handler.response_streaming
        else grpc.unary_unary_rpc_method_handler
    )
    if getattr(own, "refuses_undecodable", False):
        return make(own, request_deserializer=deserialize, response_serializer=serializer)
    if inspect.iscoroutinefunction(own):  # unary, or streaming through context.write
        behaviour: Callable[..., Awaitable[Any]] = own

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await refuse(method, request, context)
            return await behaviour(request, context)

        return make(unary, request_deserializer=deserialize, response_serializer=serializer)
    if handler.response_streaming and inspect.isasyncgenfunction(handler.unary_stream):
        streaming: Callable[..., AsyncIterator[Any]] = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await refuse(method, request, context)
            async for response in streaming(request, context):
                yield response

        return make(stream, request_deserializer=deserialize, response_serializer=serializer)
    return handler


class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Install as `grpc.aio.server(interceptors=[DecodeErrorInterceptor(), ...])`. Requests past
    `max_request_bytes` (None: no bound but grpc's) are refused unparsed; `hint` says why the
    bound is what it is, in the error."""

    def __init__(self, max_request_bytes: int | None = None, hint: str = "") -> None:
        self.max_request_bytes = max_request_bytes
        self.hint = hint or f"max {max_request_bytes}"
        # method -> (the handler grpc found, its guarded copy): wrap once, not per call
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, _guard(method, handler, self.max_request_bytes, self.hint))
            self._guarded[method] = cached
        return cached[1]
