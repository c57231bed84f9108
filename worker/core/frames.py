"""The pipe between the worker's gRPC process (service.async_engine) and its engine core
(core.engine_core): every frame that crosses it, by field name. On the wire a frame is a msgpack
array (never pickle): [kind, *fields] from the core, the Inbox's fields to it.
"""

from typing import NamedTuple, get_args

import msgpack

from nanoserve.worker.core.stats_log import Load

# ---- server -> engine core: one Inbox per flush of the event loop ----


class Add(NamedTuple):
    """A request the server checked (service.admission.admit): the core trusts it."""

    engine_id: int
    token_ids: list[int]
    params: dict  # SamplingParams.as_fields()
    cache_salt: str | None
    priority: int
    traceparent: str | None  # the server's span of the request, when traced


class Inbox(NamedTuple):
    adds: list[Add]
    aborts: list[int]  # engine ids
    exit: bool
    completion_aborts: list[list[int]]  # [engine_id, completion index]


def inbox_frame(
    adds: list[Add],
    aborts: list[int],
    exit_: bool = False,
    completion_aborts: list[list[int]] | None = None,
) -> bytes:
    return msgpack.packb(Inbox(adds, aborts, exit_, completion_aborts or []))


def read_inbox(data: bytes) -> Inbox:
    """The core's side; its adds are still arrays (Add._make each)."""
    return Inbox(*msgpack.unpackb(data))


# ---- engine core -> server: [class name, *fields]; readers rebuild nested arrays with _make ----


class Finish(NamedTuple):
    """How a completion ended, with its counts and its times in the engine core."""

    reason: str  # FinishReason value: "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_token_id: int | None
    queue_s: float = 0.0  # arrival -> first scheduled
    prefill_s: float = 0.0  # first scheduled -> first token
    decode_s: float = 0.0  # first token -> finish


# One sequence's share of a step: (engine id, new ids, Finish or None, completion index (which of
# the request's n), logprob entries of the new ids or None, entries of new prompt positions or
# None). A plain tuple, built and unpacked per token: a NamedTuple costs ~6x as much to build.
Output = tuple[int, list[int], Finish | None, int, list | None, list | None]


class Ready(NamedTuple):
    info: dict  # the engine's limits: max_model_len, vocab_size, eos_token_ids, block_size, ...


class Alive(NamedTuple):
    """Every HEARTBEAT_S from a thread of its own: the server tells a core stuck in a step from a
    frozen one."""

    step_running_s: float  # how long the current step has run (0.0 between steps)


class LoadFrame(NamedTuple):
    load: Load  # sent when the core goes idle (an array after the pipe: Load._make it)


class Step(NamedTuple):
    load: Load  # after the step (an array after the pipe: Load._make it)
    outputs: list[Output]
    step_s: float
    # [engine id, cached prompt tokens] with a request's first output: the frontend reports them
    # even when it ends the request itself (a stop string) and the finish never comes
    cached: list[list[int]]


class Refused(NamedTuple):
    engine_id: int
    reason: str


class Invalid(NamedTuple):
    """A request the engine could not run (a grammar that does not compile): INVALID_ARGUMENT."""

    engine_id: int
    reason: str


class Error(NamedTuple):
    """Fatal: the core exits after it."""

    message: str


CoreFrame = Ready | Alive | LoadFrame | Step | Refused | Invalid | Error
FROM_CORE = {kind.__name__: kind for kind in get_args(CoreFrame)}


def encode(frame: CoreFrame) -> bytes:
    return msgpack.packb([type(frame).__name__, *frame])


def decode(data: bytes) -> CoreFrame:
    kind, *fields = msgpack.unpackb(data)
    return FROM_CORE[kind]._make(fields)
