"""gRPC calls as a hostile client makes them: the status a response stream or a unary call ended
with, for tests that expect a refusal rather than an answer."""

from collections.abc import Callable

import grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def status_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def unary_status(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""
