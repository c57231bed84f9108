"""The OpenAI response bodies the gateway sends, built from the client's Chunk/Completion: whole
replies (a choice per completion, n), server-sent events (`data: {...}` ... `data: [DONE]`; their
choices are built by stream.py) and usage.
"""

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nanoserve.client.messages import Chunk, Completion, ToolCall, Usage
from nanoserve.frontend.gateway.logprobs_body import (
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs,
)

DONE = b"data: [DONE]\n\n"
# An extra field of a chat choice, present (true) only when a <tool_call> block in the content held
# no valid call: its text stayed in `content` (ChatResponse.tool_call_parse_error).
PARSE_ERROR = "tool_call_parse_error"


def usage_body(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def sse(body: dict) -> bytes:
    """One server-sent event carrying `body`."""
    return b"data: " + json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n\n"


def tool_calls_body(calls: Sequence[ToolCall], first: int | None = None) -> list[dict]:
    """OpenAI's tool_calls; streamed (`first` = how many the choice sent before) each carries
    its `index` in the choice's calls."""
    body = []
    for i, call in enumerate(calls):
        item = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        body.append(item if first is None else {"index": first + i, **item})
    return body


@dataclass
class Reply:
    """What every body of one request shares: its id, creation time and model; `chat` picks the
    chat.completion shapes over the text_completion ones; `logprobs`: the request asked for them
    (a choice without tokens then gets empty logprobs, not null); `token_ids`: it asked for
    return_token_ids (vLLM's: each choice's token_ids, and the prompt's, per choice on
    /v1/completions and in the body on chat)."""

    model: str
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: bool = False
    token_ids: bool = False
    eos: frozenset[int] = frozenset()  # the model's eos ids: no stop_reason (vLLM's)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def stop_reason(self, ended: Chunk | Completion) -> str | int | None:
        """vLLM's stop_reason of a finished choice: the stop string or the stop token id that
        ended it; None for an eos id or the length."""
        if ended.matched_stop is not None:
            return ended.matched_stop
        token = ended.matched_stop_token_id
        return None if token is None or token in self.eos else token

    def _head(self, object_type: str) -> dict:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.model}

    def _choice(self, index: int, completion: Completion, prompt: list | None = None) -> dict:
        choice: dict = {
            "index": index,
            "finish_reason": completion.finish_reason,
            "stop_reason": self.stop_reason(completion),
        }
        entries = completion.logprobs
        if entries is None and self.logprobs:
            entries = []
        if self.token_ids:
            choice["token_ids"] = completion.token_ids
        if not self.chat:
            choice["text"] = completion.text
            choice["logprobs"] = completion_logprobs(entries)
            if prompt is not None:
                choice["prompt_logprobs"] = prompt_logprobs(prompt, True)
            if self.token_ids:
                choice["prompt_token_ids"] = completion.prompt_token_ids
            return choice
        message: dict = {"role": "assistant", "content": completion.text}
        if completion.reasoning_content:
            message["reasoning_content"] = completion.reasoning_content
        if completion.tool_calls:
            message["tool_calls"] = tool_calls_body(completion.tool_calls)
            message["content"] = completion.text or None
        choice["message"] = message
        choice["logprobs"] = chat_logprobs(entries)
        if completion.tool_call_parse_error:
            choice[PARSE_ERROR] = True
        return choice

    def whole(self, completion: Completion) -> dict:
        """The non-streaming body: one choice per completion (n), the call's usage. The prompt's
        logprobs (one set per call) go on every completion's choice, as vLLM's do."""
        every = completion.choices or (completion,)
        kind = "chat.completion" if self.chat else "text_completion"
        prompt = completion.prompt_logprobs
        body = {
            **self._head(kind),
            "choices": [self._choice(i, c, prompt) for i, c in enumerate(every)],
            "usage": usage_body(completion.usage),
        }
        if self.chat and completion.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs(completion.prompt_logprobs, True)
        if self.chat and self.token_ids:
            body["prompt_token_ids"] = completion.prompt_token_ids
        return body

    def event(self, choice: dict, include_usage: bool = False, **extra: Any) -> bytes:
        """One stream event with one choice (built by stream.py). With include_usage, every
        chunk carries `usage: null` (OpenAI's shape)."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = {**self._head(kind), "choices": [choice], **extra}
        if include_usage:
            body["usage"] = None
        return sse(body)

    def usage_chunk(self, usage: Usage) -> bytes:
        """The last event of a stream with stream_options.include_usage: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(kind), "choices": [], "usage": usage_body(usage)})
