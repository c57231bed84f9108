"""Typed errors of both services and their gRPC status codes, mapped both ways.

Servicers raise ServiceError subclasses and `grpc_errors` turns them into statuses; shared/client/__init__.py
turns a failed call's status back into the same classes. Nothing but finish_reason goes in-band.
"""

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from nanoserve.request_decoding import Undecodable, refuse

logger = logging.getLogger(__name__)

# Details past this are cut: a status's details travel in one HTTP/2 header block, and one that
# overflows it turns a permanent INVALID_ARGUMENT into a retryable RESOURCE_EXHAUSTED.
MAX_DETAILS_CHARS = 1024
ECHO_CHARS = 64


def echo(value: str, limit: int = ECHO_CHARS) -> str:
    """repr() of a client-sent value for an error message, cut to `limit` characters."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class ServiceError(Exception):
    """An error that ends an RPC with the status `code` and the message as its details."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str = "") -> None:
        if len(message) > MAX_DETAILS_CHARS:
            message = message[: MAX_DETAILS_CHARS - 15] + "... (truncated)"
        super().__init__(message)
        self.message = message


class InvalidArgument(ServiceError):
    """A request field is invalid; the message names it. Fix the request."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class ResourceExhausted(ServiceError):
    """The server is at capacity (admission full, message too large). Back off and retry."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    """The server or its worker is unreachable, loading or draining. Retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    """The server cannot run the call as set up (no chat template, tokenizer mismatch)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(ServiceError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(ServiceError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Aborted(ServiceError):
    code = grpc.StatusCode.ABORTED


class Internal(ServiceError):
    """A bug or a device failure on the server. Details never carry a traceback."""

    code = grpc.StatusCode.INTERNAL


class Unknown(ServiceError):
    code = grpc.StatusCode.UNKNOWN


_ERROR_BY_CODE: dict[grpc.StatusCode, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        OutOfRange,
        Unimplemented,
        Unauthenticated,
        PermissionDenied,
        Aborted,
        Internal,
        Unknown,
    )
}
# DATA_LOSS has no class of its own; OK is not an error.
_ERROR_BY_CODE[grpc.StatusCode.DATA_LOSS] = Internal


def error_for_code(code: grpc.StatusCode, message: str = "") -> ServiceError:
    """The ServiceError for a status code (Unknown when the code has no class)."""
    return _ERROR_BY_CODE.get(code, Unknown)(message)


def error_from_rpc(error: grpc.RpcError) -> ServiceError:
    """The ServiceError for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    converted = error_for_code(code, details or "")
    converted.__cause__ = error
    return converted


# What the frontend passes on from a failed worker call as it is: the client can act on these.
_RELAYED_WORKER_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.ABORTED,  # an operator's WorkerService.Abort: do not retry as is
    }
)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def worker_status_error(code: grpc.StatusCode | int, details: str) -> ServiceError:
    """The frontend's error for a worker's status (a Session output's error_code and
    error_message, or a failed call's code and details): the codes a client can act on pass
    through (details prefixed "worker: "), CANCELLED by the worker itself (shutting down) becomes
    UNAVAILABLE, anything else INTERNAL without the worker's details."""
    if isinstance(code, int):
        code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    if code in _RELAYED_WORKER_CODES:
        return error_for_code(code, f"worker: {details}")
    if code == grpc.StatusCode.CANCELLED:
        return Unavailable("worker cancelled the request")
    return Internal(f"worker failed the request ({code.name})")


async def abort(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    """Ends the RPC with the error's status; raises grpc.aio.AbortError like context.abort."""
    await context.abort(error.code, error.message)


def grpc_errors(handler: Callable) -> Callable:
    """Decorates an async servicer method (unary or async-generator) so that a ServiceError ends the
    RPC with its status and any other exception with INTERNAL, logged here, without the traceback in
    the details. Cancellation (asyncio.CancelledError) passes through untouched. A request that
    DecodeErrorInterceptor could not parse gets INVALID_ARGUMENT before the method runs."""
    name = handler.__qualname__

    async def on_error(context: grpc.aio.ServicerContext, error: Exception) -> None:
        if isinstance(error, ServiceError):
            await abort(context, error)
        logger.exception("%s failed", name)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext):
            if isinstance(request, Undecodable):  # see DecodeErrorInterceptor
                await refuse(name, request, context)
            try:
                async for response in handler(self, request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes a status
                await on_error(context, e)

        # read by request_decoding; setattr: the wrapper's type has no such attribute for mypy
        setattr(stream_wrapper, "refuses_undecodable", True)  # noqa: B010
        return stream_wrapper

    @functools.wraps(handler)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext):
        if isinstance(request, Undecodable):
            await refuse(name, request, context)
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001
            await on_error(context, e)

    setattr(unary_wrapper, "refuses_undecodable", True)  # noqa: B010
    return unary_wrapper
