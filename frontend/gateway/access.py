"""The gateway's outermost ASGI middleware: one Access record per HTTP request (its id, taken from
X-Request-Id or made here and sent back on every response; route, status, body bytes, first
streamed event, duration), handed when the request ends to its sinks: RequestLog's one line here,
GatewayMetrics (metrics.py). The routes fill in what only they know (finish reason, usage).
"""

import json
import logging
import os
import time
from collections.abc import Callable, Collection, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from nanoserve.client.messages import Usage
from nanoserve.errors import echo
from nanoserve.frontend.gateway.body_limit import ASGIApp, Message, Receive, Scope, Send
from nanoserve.log import check_log_format
from nanoserve.wire import MAX_REQUEST_ID_LENGTH

logger = logging.getLogger("nanoserve.requests")
REQUEST_ID_HEADER = b"x-request-id"
OTHER_ROUTE = "other"  # any path the app does not serve: labels stay few whatever callers send
CLIENT_CLOSED = 499  # nginx's status for a client that went away before its response


def request_id_from(value: bytes | None) -> str | None:
    """A caller's X-Request-Id when it can travel on as the gRPC request_id and into logs as is:
    1..128 printable ASCII characters; None otherwise (the request then gets an id of ours)."""
    if value is None or not 0 < len(value) <= MAX_REQUEST_ID_LENGTH or not value.isascii():
        return None
    text = value.decode("ascii")
    return text if text.isprintable() else None


def new_request_id() -> str:
    """32 random hex digits, the shape of the frontend's own ids (uuid4().hex) at a quarter of
    the cost. Unguessable: the frontend refuses an id already in flight (409), so a predictable
    one would let a caller block another's request."""
    return os.urandom(16).hex()


@dataclass(slots=True)
class Access:
    """One HTTP request, from its arrival at the gateway to the end of its response."""

    request_id: str
    route: str  # the served path, or OTHER_ROUTE
    method: str
    peer: str
    start: float = field(default_factory=time.perf_counter)
    status: int = 0  # the status the response started with; 0: none was sent
    body_bytes: int = 0  # of the request body, as read
    first_event_at: float | None = None  # a stream's first event handed to the server
    end: float | None = None
    complete: bool = False  # the response's last byte was handed to the server
    disconnected: bool = False  # the client went away before that
    stream_error: int | None = None  # the status in a stream's error event (its response: 200)
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # None: not known (no usage came back)
    completion_tokens: int | None = None
    parsed_at: float | None = None  # the body was parsed and mapped (a completion route)
    span: Any = None  # its trace span, while tracing is on (request_trace.py)

    def ended(
        self, usage: Usage | None, finish_reason: str | None, error_status: int | None = None
    ) -> None:
        """What a completion route learned at its end: the call's usage and finish reason (one
        choice's, with n > 1), and for a stream the status of the error event it sent."""
        if usage is not None:
            self.prompt_tokens = usage.prompt_tokens
            self.completion_tokens = usage.completion_tokens
        self.finish_reason = finish_reason
        self.stream_error = error_status

    @property
    def outcome(self) -> int:
        """The status the request is counted and logged with: 499 when the client went away first,
        500 when no response was sent at all, a stream's error status over its 200."""
        if self.disconnected:
            return CLIENT_CLOSED
        if self.status == 0:
            return 500
        return self.stream_error or self.status

    @property
    def ttft(self) -> float | None:
        """Arrival to the first streamed event (None: not a stream, or no event was sent)."""
        return None if self.first_event_at is None else self.first_event_at - self.start

    @property
    def duration(self) -> float:
        return (self.end if self.end is not None else time.perf_counter()) - self.start


AccessSink = Callable[[Access], None]
_STATE_KEY = "access"  # Starlette's request.state is scope["state"]


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def access_of(scope: MutableMapping[str, Any]) -> Access:
    """The request's Access record, put in scope["state"] by AccessLog; an app served without
    AccessLog (unit tests) gets one here, kept for the rest of the request."""
    state = scope.setdefault("state", {})
    access = state.get(_STATE_KEY)
    if access is None:
        access = state[_STATE_KEY] = Access(
            new_request_id(), scope.get("path", ""), scope.get("method", ""), _peer(scope)
        )
    return access


class AccessLog:
    """ASGI middleware around the whole app (body limit included: a 413 is a request too). Only
    watches the messages it passes on, and adds the X-Request-Id header to the response's start."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Collection[str],
        sinks: list[AccessSink],
        start_span: Callable[[Access, Any], None] | None = None,
    ) -> None:
        """`start_span(access, headers)`: tracing on, called as each request arrives."""
        self.app = app
        self.routes = frozenset(routes)
        self.sinks = sinks
        self.start_span = start_span
        self.in_flight = 0  # read by the metrics' gauge at scrape time

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                given = request_id_from(value)
                break
        path = scope["path"]
        access = Access(
            given or new_request_id(),
            path if path in self.routes else OTHER_ROUTE,
            scope["method"][:16],
            _peer(scope),
        )
        scope.setdefault("state", {})[_STATE_KEY] = access
        if self.start_span is not None:
            self.start_span(access, scope["headers"])
        header = (REQUEST_ID_HEADER, access.request_id.encode("ascii"))

        async def watched_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                access.body_bytes += len(message.get("body", b""))
            elif message["type"] == "http.disconnect" and not access.complete:
                access.disconnected = True
            return message

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    access.complete = True
                elif access.first_event_at is None:  # only streamed responses send more_body
                    access.first_event_at = time.perf_counter()
            elif message["type"] == "http.response.start":
                access.status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        self.in_flight += 1
        try:
            await self.app(scope, watched_receive, tagged_send)
        finally:
            self.in_flight -= 1
            access.end = time.perf_counter()
            for sink in self.sinks:
                try:
                    sink(access)
                except Exception:
                    logger.exception("request sink failed")


class RequestLog:
    """Writes one line per ended request to the `nanoserve.requests` logger, in the frontend's
    style (text, or one JSON object with --log-format json); never the prompt, the body or the
    caller's token."""

    def __init__(self, log_format: str = "text") -> None:
        check_log_format(log_format)
        self.log_format = log_format

    def format(self, access: Access) -> str:
        ttft = access.ttft
        prompt, completion = access.prompt_tokens, access.completion_tokens
        if self.log_format == "json":
            fields = {
                "event": "request_end",
                "request_id": access.request_id[:MAX_REQUEST_ID_LENGTH],
                "method": access.method,
                "route": access.route,
                "status": access.outcome,
                "finish_reason": access.finish_reason,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "ttft_s": None if ttft is None else round(ttft, 6),
                "duration_s": round(access.duration, 6),
                "peer": access.peer,
            }
            return json.dumps(fields, ensure_ascii=True)
        return (
            f"request {echo(access.request_id, MAX_REQUEST_ID_LENGTH)} {access.method}"
            f" {access.route} {access.outcome} finish={access.finish_reason or '-'}"
            f" prompt={'-' if prompt is None else prompt}"
            f" completion={'-' if completion is None else completion}"
            f" ttft={'-' if ttft is None else f'{ttft:.3f}s'} duration={access.duration:.3f}s"
            f" peer={access.peer}"
        )

    def __call__(self, access: Access) -> None:
        # a 500 is the gateway's own failure: WARNING, as the frontend logs INTERNAL
        level = logging.WARNING if access.outcome == 500 else logging.INFO
        if logger.isEnabledFor(level):
            logger.log(level, "%s", self.format(access))
