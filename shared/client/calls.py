"""The streamed FrontendService calls that Client and AsyncClient share: each request built from
plain arguments (nanoserve.client.requests) and sent through the subclass's `_stream`, which
yields Chunks from a blocking iterator or an asyncio one."""

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from nanoserve.client.messages import ChatMessages, Tools
from nanoserve.client.requests import chat_request, generate_request

StreamT = TypeVar("StreamT")  # Iterator[Chunk] (Client) or AsyncIterator[Chunk] (AsyncClient)


class StreamedCalls(Generic[StreamT]):
    _stub: Any  # the FrontendService stub the next call goes to

    def _stream(self, method: Any, request: Any, timeout: float | None) -> StreamT:
        raise NotImplementedError

    def generate_stream(
        self,
        prompt: str | Sequence[int],
        *,
        timeout: float | None = None,
        request_id: str = "",
        add_special_tokens: bool | None = None,
        priority: int | None = None,
        **sampling: Any,
    ) -> StreamT:
        """Streams the completion of `prompt` (text or token ids); keyword arguments are
        SamplingParams fields (temperature, max_tokens, stop, n, ...); with n > 1 each chunk's
        `index` says which completion it continues. priority: lower is served first.
        stream_interval=N: after the first chunk, one per N tokens (1..256; fewer, bigger chunks
        cost less per token; chat_stream takes it too). return_prompt_token_ids=True: the first
        chunk's `prompt_token_ids` is the prompt as the frontend tokenized it (chat_stream: as
        the chat template rendered it)."""
        request = generate_request(prompt, request_id, add_special_tokens, priority, **sampling)
        return self._stream(self._stub.Generate, request, timeout)

    def chat_stream(
        self,
        messages: ChatMessages,
        *,
        timeout: float | None = None,
        request_id: str = "",
        enable_thinking: bool | None = None,
        priority: int | None = None,
        tools: Tools | None = None,
        tool_choice: str = "",
        tool_choice_function: str = "",
        parallel_tool_calls: bool | None = None,
        separate_reasoning: bool | None = None,
        **sampling: Any,
    ) -> StreamT:
        """Streams the reply to `messages` ({"role", "content"} dicts or (role, content) pairs).
        `tools` (OpenAI's shape) are rendered by the model's chat template and the reply's calls
        come back as Chunk.tool_calls (tool_choice "none": no tools). tool_choice "required" makes
        the model call one or more of them, `tool_choice_function="name"` exactly that one once
        (constrained decoding; the model may reason first when thinking is on).
        `parallel_tool_calls=False`: at most one call ("required": exactly one; "auto": the first
        call only). `separate_reasoning` moves the model's <think> reasoning from `text` to
        Chunk.reasoning_content."""
        request = chat_request(
            messages,
            request_id,
            enable_thinking,
            priority,
            tools=tools,
            tool_choice=tool_choice,
            tool_choice_function=tool_choice_function,
            parallel_tool_calls=parallel_tool_calls,
            separate_reasoning=separate_reasoning,
            **sampling,
        )
        return self._stream(self._stub.Chat, request, timeout)
