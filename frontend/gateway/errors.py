"""OpenAI-shaped errors of the gateway: `{"error": {"message", "type", "param", "code"}}` with the
HTTP status that matches, from a gateway check (OpenAIError), a body pydantic refused or a failed
gRPC call (ServiceError).
"""

import re
from collections.abc import Sequence
from typing import Any

import grpc

from nanoserve.errors import ServiceError

# gRPC status -> (HTTP status, OpenAI error type). Codes not listed are 500 internal_error.
STATUS_BY_CODE: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),  # e.g. no chat template
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),  # admission full
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "not_implemented_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
INTERNAL = (500, "internal_error")
# Codes whose details are the server's own words about the request; others are not echoed.
_ECHOED = frozenset(
    code for code, (status, _) in STATUS_BY_CODE.items() if status < 500 or status in (503, 504)
)
# "sampling_params.stop[1]: must not be empty" -> field "sampling_params.stop[1]"
_FIELD = re.compile(r"^(?:worker: )?(?P<field>[A-Za-z_][\w.]*(?:\[\d+\])*(?:\.[\w]+)*): ")


class OpenAIError(Exception):
    """An error the gateway answers with: HTTP `status` and the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_param(param: str, message: str) -> OpenAIError:
    """400 naming the request parameter (the OpenAI SDK raises BadRequestError)."""
    return OpenAIError(400, f"{param}: {message}", param=param, code="invalid_value")


def from_service_error(
    error: ServiceError, param_names: dict[str, str] | None = None
) -> OpenAIError:
    """The HTTP error for a failed gRPC call. `param_names` maps the gRPC field a message names
    (`sampling_params.max_tokens`) back to the OpenAI parameter the caller sent (`max_tokens`)."""
    status, kind = STATUS_BY_CODE.get(error.code, INTERNAL)
    message = error.message if error.code in _ECHOED else "internal error"
    param = None
    match = _FIELD.match(error.message) if error.code == grpc.StatusCode.INVALID_ARGUMENT else None
    if match:
        field = match["field"]
        base = field.split("[", 1)[0]
        name = (param_names or {}).get(base, base.removeprefix("sampling_params."))
        param = name + field[len(base) :]
    return OpenAIError(status, message or error.code.name, kind, param, error.code.name.lower())


def _param(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the parameter path: ("body", "messages", 0, "role") ->
    "messages[0].role"; union member names (pydantic adds them) are dropped."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not (isinstance(part, str) and ("[" in part or part in ("str", "list", "int"))):
            path += f".{part}" if path else str(part)
    return path


def from_validation_errors(errors: Sequence[Any]) -> OpenAIError:
    """The 400 for a body that failed validation: its first error, naming the parameter."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid body"}
    param = _param(tuple(first.get("loc", ()))) or None
    if first.get("type") == "extra_forbidden":
        message = f"unrecognized request argument: {param}"
    else:
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    code = str(first.get("type", "invalid_value"))
    return OpenAIError(400, message, param=param, code=code)
