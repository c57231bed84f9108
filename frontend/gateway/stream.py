"""A gRPC call's chunks as OpenAI stream events: per chunk one event for its choice (`index`, n)
with the text (chat: a delta of content, reasoning_content and tool_calls), logprobs and finish
reason (with return_token_ids its token ids, and the prompt's on the first event: each choice's
on /v1/completions, the stream's on chat); then, with include_usage, the usage; then [DONE].
app.py serves them as server-sent events.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from nanoserve.client.messages import Chunk
from nanoserve.errors import ServiceError
from nanoserve.frontend.gateway.access import Access
from nanoserve.frontend.gateway.errors import OpenAIError, from_service_error
from nanoserve.frontend.gateway.logprobs_body import (
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs,
)
from nanoserve.frontend.gateway.responses import DONE, PARSE_ERROR, Reply, sse, tool_calls_body


@dataclass
class ChoiceState:
    """What a stream remembers of one choice: where its text is (legacy text_offset) and how many
    tool calls it sent (their `index`)."""

    offset: int = 0
    tool_calls: int = 0
    prompt_ids_sent: bool = False


@dataclass
class StreamShaper:
    """Turns chunks into events for one request of `n` choices."""

    reply: Reply
    n: int = 1
    include_usage: bool = False
    choices: dict[int, ChoiceState] = field(default_factory=dict)
    prompt_logprobs_sent: bool = False
    # prompt entries of messages that carried nothing else (the frontend bounds each message's
    # entries): held back so the first token's event has them all, as vLLM streams them
    held_prompt_logprobs: list = field(default_factory=list)
    prompt_token_ids: list[int] | None = None  # return_token_ids: the call's first chunk's
    prompt_ids_sent: bool = False  # chat: on the stream's first event

    def opening(self, first: Chunk) -> list[bytes]:
        """Chat: each choice's role delta first, as OpenAI sends it (with return_token_ids the
        first one carries the prompt's ids; `first` is the call's first chunk)."""
        self.prompt_token_ids = first.prompt_token_ids
        if not self.reply.chat:
            return []
        events = []
        for i in range(self.n):
            extra = {}
            if self.reply.token_ids and not self.prompt_ids_sent:
                extra["prompt_token_ids"], self.prompt_ids_sent = self.prompt_token_ids, True
            choice = {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            events.append(self.reply.event(choice, self.include_usage, **extra))
        return events

    def event(self, chunk: Chunk) -> bytes | None:
        """The chunk's event, or None when it carries nothing to say."""
        token_ids = self.reply.token_ids
        if chunk.prompt_token_ids is not None:
            self.prompt_token_ids = chunk.prompt_token_ids
        if chunk.prompt_logprobs and not (
            chunk.text
            or chunk.reasoning_content
            or chunk.tool_calls
            or chunk.logprobs
            or chunk.token_ids
            or chunk.finish_reason is not None
        ):
            self.held_prompt_logprobs += chunk.prompt_logprobs
            return None
        if self.held_prompt_logprobs:
            held, self.held_prompt_logprobs = self.held_prompt_logprobs, []
            chunk = replace(chunk, prompt_logprobs=held + list(chunk.prompt_logprobs or ()))
        if not (
            chunk.text
            or chunk.reasoning_content
            or chunk.tool_calls
            or chunk.logprobs
            or chunk.prompt_logprobs
            or chunk.finish_reason is not None
            or (token_ids and chunk.token_ids)  # ids whose text is held back (a partial character)
        ):
            return None
        state = self.choices.setdefault(chunk.index, ChoiceState())
        choice: dict = {"index": chunk.index}
        extra: dict = {}
        if token_ids:
            choice["token_ids"] = list(chunk.token_ids)
            if self.reply.chat and not self.prompt_ids_sent:
                extra["prompt_token_ids"], self.prompt_ids_sent = self.prompt_token_ids, True
            elif not self.reply.chat and not state.prompt_ids_sent:
                choice["prompt_token_ids"], state.prompt_ids_sent = self.prompt_token_ids, True
        prompt = prompt_logprobs(chunk.prompt_logprobs, not self.prompt_logprobs_sent)
        self.prompt_logprobs_sent |= prompt is not None
        if self.reply.chat:
            delta: dict = {}
            if chunk.text:
                delta["content"] = chunk.text
            if chunk.reasoning_content:
                delta["reasoning_content"] = chunk.reasoning_content
            if chunk.tool_calls:
                delta["tool_calls"] = tool_calls_body(chunk.tool_calls, state.tool_calls)
                state.tool_calls += len(chunk.tool_calls)
            choice["delta"] = delta
            choice["logprobs"] = chat_logprobs(chunk.logprobs)
            if chunk.tool_call_parse_error:  # on the event whose content has the block
                choice[PARSE_ERROR] = True
            if prompt is not None:
                extra["prompt_logprobs"] = prompt
        else:
            choice["text"] = chunk.text
            choice["logprobs"] = completion_logprobs(chunk.logprobs, state.offset)
            state.offset += sum(len(e.text) for e in chunk.logprobs or ())
            if prompt is not None:
                choice["prompt_logprobs"] = prompt
        choice["finish_reason"] = chunk.finish_reason
        if chunk.finish_reason is not None:
            choice["stop_reason"] = self.reply.stop_reason(chunk)
        return self.reply.event(choice, self.include_usage, **extra)


async def events(
    shaper: StreamShaper,
    first: Chunk,
    chunks: AsyncIterator[Chunk],
    param_names: dict[str, str],
    access: Access | None = None,
) -> AsyncIterator[bytes]:
    """The stream's events until every choice finished. A failure mid-stream becomes an error
    event (the SDK raises it). Cancelled (the caller hung up): closing `chunks` cancels the call.
    `access` learns the usage, the finish reason and an error event's status as the stream ends."""
    finished: set[int] = set()
    usage = None
    finish_reason: str | None = None
    error: OpenAIError | None = None
    try:
        for opening in shaper.opening(first):
            yield opening
        chunk: Chunk | None = first
        while chunk is not None:
            event = shaper.event(chunk)
            if event is not None:
                yield event
            if chunk.finish_reason is not None:
                finished.add(chunk.index)
                finish_reason = chunk.finish_reason
            usage = chunk.usage or usage  # the call's last message carries it
            chunk = await anext(chunks, None)
        if len(finished) < shaper.n or usage is None:
            error = OpenAIError(500, "the stream ended without a finish reason", "internal_error")
            yield sse(error.body())
        elif shaper.include_usage:
            yield shaper.reply.usage_chunk(usage)
    except ServiceError as e:
        error = from_service_error(e, param_names)
        yield sse(error.body())
    finally:
        if access is not None:
            access.ended(usage, finish_reason, None if error is None else error.status)
        await chunks.aclose()  # type: ignore[attr-defined]
    yield DONE
