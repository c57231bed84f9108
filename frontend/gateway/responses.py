"""The OpenAI response bodies the gateway sends, built from the client's Chunk/Completion: whole
replies, server-sent-event chunks of a stream (`data: {...}` ... `data: [DONE]`) and usage.
"""

import json
import time
import uuid
from dataclasses import dataclass, field

from nanoserve.client_messages import Completion, Usage

DONE = b"data: [DONE]\n\n"


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


@dataclass
class Reply:
    """What every body of one request shares: its id, creation time and model; `chat` picks the
    chat.completion shapes over the text_completion ones."""

    model: str
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _head(self, object_type: str) -> dict:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.model}

    def whole(self, completion: Completion) -> dict:
        """The non-streaming body."""
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": completion.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = completion.text
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": usage_body(completion.usage)}

    def chunk(
        self, text: str | None, finish_reason: str | None = None, include_usage: bool = False
    ) -> bytes:
        """One stream event with a text delta (chat: text None = the opening role delta).
        With include_usage, every chunk carries `usage: null` (OpenAI's shape)."""
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if text is None else {}
            if text:
                choice["delta"]["content"] = text
        else:
            choice["text"] = text or ""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = {**self._head(kind), "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    def usage_chunk(self, usage: Usage) -> bytes:
        """The last event of a stream with stream_options.include_usage: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(kind), "choices": [], "usage": usage_body(usage)})
