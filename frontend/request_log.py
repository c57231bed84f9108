"""One record per public Generate/Chat call, from arrival to its end (finished, cancelled, deadline,
refused, error), and the one log line it leaves (text, or a JSON object with --log-format json).

`recorded` wraps a streaming servicer method: it fills a RequestRecord from the responses and the
final status, and hands it to the servicer's `request_sinks` (the log line, the metrics).
"""

import asyncio
import contextvars
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from nanoserve.errors import echo
from nanoserve.log import check_log_format
from nanoserve.proto.v1 import common_pb2
from nanoserve.request_decoding import Undecodable
from nanoserve.tracing import traceparent_in, wall_ns
from nanoserve.wire import FINISH_REASONS

logger = logging.getLogger("nanoserve.requests")
REQUEST_ID_METADATA = "x-request-id"


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    peer: str
    start: float = field(default_factory=time.perf_counter)
    code: str = "CANCELLED"  # until the call ends otherwise: a client that goes away never says
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    sent_at: float | None = None  # handed to the worker: the frontend's own latency ends here
    end: float | None = None
    tokenized_at: float | None = None  # the prompt's ids are known (tokenized, or given)
    detokenize_s: float = 0.0  # time spent detokenizing, measured only while traced
    span: Any = None  # the call's trace span, while tracing is on (request_trace.py)

    def add(self, response: Any) -> None:
        """Counts one GenerateResponse/ChatResponse (add_tokens, then finish)."""
        if response.token_ids:
            self.add_tokens(len(response.token_ids))
        self.finish(response)

    def add_tokens(self, count: int) -> None:
        """`count` more output ids go out now: RequestRunner calls it per message, from the
        fields it already holds (cheaper than reading them back from each response proto)."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.completion_tokens += count

    def finish(self, response: Any) -> None:
        """The finish reason and usage, when `response` is a call's last message."""
        if response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
            self.finish_reason = FINISH_REASONS.get(response.finish_reason, "unknown")
            self.prompt_tokens = response.usage.prompt_tokens
            self.cached_tokens = response.usage.cached_tokens
            self.completion_tokens = response.usage.completion_tokens or self.completion_tokens

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.start

    @property
    def duration(self) -> float:
        return (self.end if self.end is not None else time.perf_counter()) - self.start

    @property
    def frontend_latency(self) -> float | None:
        """Arrival to the worker request sent (tokenize, template, validate); None if never sent."""
        return None if self.sent_at is None else self.sent_at - self.start

    @property
    def inter_token_latency(self) -> float | None:
        """Mean time between tokens after the first (None with fewer than 2 tokens)."""
        if self.first_token_at is None or self.last_token_at is None or self.completion_tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.completion_tokens - 1)


# what a JSON log line holds of a record (its clock readings and span stay out)
_LOGGED_FIELDS = (
    "request_id",
    "method",
    "peer",
    "code",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
)
RequestSink = Callable[[RequestRecord], None]
# the record of the call this task serves (each grpc.aio call runs in its own task)
_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "nanoserve_request_record", default=None
)


def current_record() -> RequestRecord | None:
    """The record of the call this task serves (None outside `recorded`)."""
    return _current.get()


def mark_tokenized() -> None:
    """Called once the prompt's ids are known: ends the call's tokenize phase."""
    record = _current.get()
    if record is not None and record.tokenized_at is None:
        record.tokenized_at = time.perf_counter()


def mark_sent_to_worker() -> None:
    """Called as the request goes to the worker: ends the frontend's own part of its latency."""
    record = _current.get()
    if record is not None and record.sent_at is None:
        record.sent_at = time.perf_counter()


class RequestLog:
    """Writes one line per ended request to the `nanoserve.requests` logger."""

    def __init__(self, log_format: str = "text") -> None:
        check_log_format(log_format)
        self.log_format = log_format

    def format(self, record: RequestRecord) -> str:
        ttft = record.ttft
        if self.log_format == "json":
            fields = {name: getattr(record, name) for name in _LOGGED_FIELDS}
            fields.update(
                event="request_end",
                request_id=record.request_id[:128],
                ttft_s=None if ttft is None else round(ttft, 6),
                duration_s=round(record.duration, 6),
            )
            return json.dumps(fields, ensure_ascii=True)
        return (
            f"request {echo(record.request_id, 128)} {record.method} {record.code}"
            f" finish={record.finish_reason or '-'} prompt={record.prompt_tokens}"
            f" completion={record.completion_tokens} cached={record.cached_tokens}"
            f" ttft={'-' if ttft is None else f'{ttft:.3f}s'} duration={record.duration:.3f}s"
            f" peer={record.peer}"
        )

    def __call__(self, record: RequestRecord) -> None:
        level = logging.WARNING if record.code in ("INTERNAL", "UNKNOWN") else logging.INFO
        logger.log(level, "%s", self.format(record))


def _metadata_safe(request_id: str) -> bool:
    return 0 < len(request_id) <= 128 and request_id.isascii() and request_id.isprintable()


def recorded(handler: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """Wraps an async-generator servicer method (outside grpc_errors). A request without an id
    gets one here, before the handler runs, and the id goes back as `x-request-id` trailing
    metadata. The servicer's `request_sinks` see the record once the call has ended."""
    method = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext):
        if isinstance(request, Undecodable):  # refused inside, with its own log line
            async for response in handler(self, request, context):
                yield response  # pragma: no cover - there is none
            return
        if not request.request_id:
            request.request_id = uuid.uuid4().hex
        record = RequestRecord(request.request_id, method, context.peer())
        tracer = getattr(self, "tracer", None)
        if tracer is not None:  # tracing on: the call's span, the caller's trace continued
            record.span = tracer.start(
                method,
                traceparent_in(context.invocation_metadata()),
                start_ns=wall_ns(record.start),
            )
        _current.set(record)
        if _metadata_safe(request.request_id):
            context.set_trailing_metadata(((REQUEST_ID_METADATA, request.request_id),))
        last = None
        try:
            # output ids are counted by RequestRunner (RequestRecord.add_tokens) as it makes each
            # message; here only the last message is read, for its finish and usage
            async for response in handler(self, request, context):
                last = response
                yield response
            record.code = "OK"
        except grpc.aio.AbortError:
            code = context.code()
            record.code = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            raise
        except asyncio.CancelledError:
            record.code = "CANCELLED"
            raise
        finally:
            if last is not None:
                record.finish(last)
            record.end = time.perf_counter()
            if record.code == "CANCELLED" and context.time_remaining() is not None:
                if context.time_remaining() <= 0:
                    record.code = "DEADLINE_EXCEEDED"
            for sink in getattr(self, "request_sinks", ()):
                try:
                    sink(record)
                except Exception:
                    logger.exception("request sink failed")

    return wrapper
