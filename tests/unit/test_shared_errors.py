"""nanoserve.errors: status codes <-> exception classes, and the servicer decorator."""

import asyncio

import grpc
import grpc.aio
import pytest

from nanoserve import errors


@pytest.mark.parametrize(
    "cls",
    [
        errors.InvalidArgument,
        errors.ResourceExhausted,
        errors.Unavailable,
        errors.DeadlineExceeded,
        errors.Cancelled,
        errors.NotFound,
        errors.AlreadyExists,
        errors.FailedPrecondition,
        errors.OutOfRange,
        errors.Unimplemented,
        errors.Unauthenticated,
        errors.PermissionDenied,
        errors.Aborted,
        errors.Internal,
        errors.Unknown,
    ],
)
def test_round_trip(cls: type[errors.ServiceError]) -> None:
    error = errors.error_for_code(cls.code, "details")
    assert type(error) is cls and error.message == "details" and isinstance(error, Exception)


def test_unmapped_code_is_unknown_and_data_loss_internal() -> None:
    assert type(errors.error_for_code(grpc.StatusCode.DATA_LOSS)) is errors.Internal
    assert type(errors.error_for_code(grpc.StatusCode.OK)) is errors.Unknown


def test_invalid_argument_names_field() -> None:
    error = errors.InvalidArgument("must be finite, got nan", field="sampling_params.temperature")
    assert str(error) == "sampling_params.temperature: must be finite, got nan"
    assert error.field == "sampling_params.temperature"


def test_error_from_rpc() -> None:
    rpc_error = grpc.aio.AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "full"
    )
    error = errors.error_from_rpc(rpc_error)
    assert isinstance(error, errors.ResourceExhausted) and error.message == "full"
    assert error.__cause__ is rpc_error


class _Context:
    """Records context.abort like grpc.aio does (it raises AbortError)."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


class _Servicer:
    @errors.grpc_errors
    async def Unary(self, request, context):
        if request == "bad":
            raise errors.InvalidArgument("empty", field="prompt")
        if request == "bug":
            raise KeyError("secret traceback detail")
        return request

    @errors.grpc_errors
    async def Stream(self, request, context):
        yield 1
        if request == "bug":
            raise RuntimeError("boom")
        raise errors.Unavailable("worker down")


def test_decorator_maps_errors() -> None:
    async def run() -> None:
        servicer = _Servicer()
        assert await servicer.Unary("ok", _Context()) == "ok"
        context = _Context()
        with pytest.raises(grpc.aio.AbortError):
            await servicer.Unary("bad", context)
        assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "prompt: empty")
        context = _Context()
        with pytest.raises(grpc.aio.AbortError):
            await servicer.Unary("bug", context)
        assert context.aborted == (grpc.StatusCode.INTERNAL, "internal error")

        for request, expected in (
            ("x", (grpc.StatusCode.UNAVAILABLE, "worker down")),
            ("bug", (grpc.StatusCode.INTERNAL, "internal error")),
        ):
            context, received = _Context(), []
            with pytest.raises(grpc.aio.AbortError):
                async for item in servicer.Stream(request, context):
                    received.append(item)
            assert received == [1] and context.aborted == expected

    asyncio.run(run())
