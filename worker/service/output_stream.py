"""A request's output in the worker's gRPC process, between the engine core's step frames
(worker.service.async_engine fans them out) and the request's consumer (GenerateTokens, a Session).

Every stream keeps at most one pending delta: ids that arrive before its consumer runs are merged
into it (vLLM's RequestOutputCollector). Each stream's owner Collector wakes its consumer: a
Session's holds all of that Session's streams (flushed once per frame), a GenerateTokens call's one.
"""

import asyncio
from dataclasses import dataclass, field
from typing import Any

from nanoserve.logprob_split import MAX_LOGPROBS_PER_MESSAGE, split_logprobs
from nanoserve.worker.core.frames import Finish


@dataclass(slots=True)
class Completion:
    """One of a request's n completions, as its consumer has not taken it yet."""

    ids: list[int] = field(default_factory=list)  # new ids not yet taken by the consumer
    # logprob entries of those ids and new prompt positions (worker.runner.logprobs), if asked
    logprobs: list[list] | None = None
    prompt_logprobs: list[list] | None = None
    finish: Finish | None = None
    reported: bool = False  # the consumer took its finish
    aborted: bool = False  # ended by its consumer (AsyncEngine.abort_completion): no more output

    @property
    def has_output(self) -> bool:
        return (
            bool(self.ids)
            or bool(self.prompt_logprobs)
            or (self.finish is not None and not self.reported)
        )

    def add_logprobs(self, logprobs: list[list] | None, prompt: list[list] | None) -> None:
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
        if prompt is not None:
            self.prompt_logprobs = (self.prompt_logprobs or []) + prompt


@dataclass(frozen=True, slots=True)
class Taken:
    """What a consumer takes of one completion at a time."""

    index: int  # which of the request's n completions
    ids: list[int]
    finish: Finish | None  # once, when it ended
    logprobs: list[list] | None
    prompt_logprobs: list[list] | None

    def pieces(self, max_entries: int = MAX_LOGPROBS_PER_MESSAGE) -> list["Taken"]:
        """This take as several, each with at most `max_entries` logprob entries (a slow consumer
        let a long prompt's entries pile up); the finish goes with the final one."""
        if len(self.logprobs or ()) + len(self.prompt_logprobs or ()) <= max_entries:
            return [self]
        return [
            Taken(
                self.index,
                piece.ids,
                self.finish if piece.last else None,
                piece.logprobs if self.logprobs is not None else None,
                piece.prompt_logprobs if self.prompt_logprobs is not None else None,
            )
            for piece in split_logprobs(
                self.ids, self.logprobs or [], self.prompt_logprobs or [], max_entries
            )
        ]


@dataclass(eq=False, slots=True)
class Stream:
    """One request: its caller's id (for logs and Abort), the engine's id (unique for the process:
    a reused request_id never receives an ended request's tokens) and the pending output of each
    of its n completions (SamplingParams.n)."""

    request_id: str
    engine_id: int
    owner: "Collector"  # a Session's, flushed together; GenerateTokens' holds this one stream
    completions: list[Completion] = field(default_factory=lambda: [Completion()])
    num_finished: int = 0  # completions that ended
    error: Exception | None = None
    caller: str | None = None  # who started it (the worker token's name): only it may Abort it
    cached_tokens: int | None = None  # the prompt's prefix-cache hit, known with its first output
    cached_sent: bool = False  # a Session told its frontend (with the first output)
    span: Any = None  # its trace span, while tracing is on (nanoserve.tracing)

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.completions)

    @property
    def has_output(self) -> bool:
        return self.error is not None or any(c.has_output for c in self.completions)

    def take(self) -> list[Taken]:
        """The output of each completion that has some (its finish once ended); marks it taken."""
        out = []
        for index, c in enumerate(self.completions):
            if c.has_output:
                finish = None if c.reported else c.finish
                out.append(Taken(index, c.ids, finish, c.logprobs, c.prompt_logprobs))
                c.ids, c.logprobs, c.prompt_logprobs = [], None, None
                c.reported = c.finish is not None
        return out


class Collector:
    """A set of streams delivered together (one Session): `ready` holds those with output."""

    def __init__(self) -> None:
        self.ready: dict[int, Stream] = {}  # engine id -> stream, in order of first output
        self.event = asyncio.Event()

    def notify(self, stream: Stream) -> None:
        self.ready[stream.engine_id] = stream
        self.event.set()

    def take(self) -> list[Stream]:
        streams = list(self.ready.values())
        self.ready.clear()
        self.event.clear()
        return streams
