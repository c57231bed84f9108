"""The Python client's results: Chunk, Completion, ModelInfo, Detokenized (and ToolCall, Usage,
TokenLogprobs within them) read from FrontendService's responses. nanoserve.client.requests builds
the requests; nanoserve.client sends them."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.errors import ServiceError
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.wire import FINISH_REASONS

DEFAULT_ADDRESS = "127.0.0.1:50051"
SERVICE_NAME = "nanoserve.v1.FrontendService"

# {"role", "content"} dicts (OpenAI's shape: an assistant turn may add "tool_calls" and
# "reasoning_content", a tool turn "tool_call_id" and "name") or (role, content) pairs.
ChatMessages = Iterable[Mapping[str, Any] | tuple[str, str]]
# OpenAI's tool shape: {"type": "function", "function": {"name", "description", "parameters"}},
# parameters a JSON Schema dict (or its JSON string).
Tools = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model made; `arguments` is a JSON object as a string."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's shape, for an assistant message's "tool_calls" in the next request."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Logprob:
    """One alternative token: its id, natural-log probability and text."""

    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The logprobs of one output (or prompt) token: its own, its rank (1 = most likely) and the
    most likely alternatives, most likely first."""

    token_id: int
    logprob: float
    rank: int
    text: str
    top_logprobs: list[Logprob]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed message: a text delta (valid UTF-8) and the new token ids."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # None while running, then "stop" or "length"
    usage: Usage | None = None  # the call's last chunk only
    matched_stop: str | None = None
    matched_stop_token_id: int | None = None
    reasoning_content: str = ""  # Chat with separate_reasoning: the reasoning delta
    tool_calls: tuple[ToolCall, ...] = ()  # Chat with tools: calls completed in this chunk
    tool_call_parse_error: bool = False  # a <tool_call> block in `text` held no valid call
    index: int = 0  # which of the request's n completions (sampling parameter n)
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when asked (logprobs=k)
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1..n-1 (prompt_logprobs=k)
    # the prompt's ids, on the call's first chunk (return_prompt_token_ids=True)
    prompt_token_ids: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole request's output, the concatenation of its chunks. With n > 1, `choices` holds
    every completion by index (this one's fields are choices[0]'s; usage is the call's: the
    prompt once, the completion tokens of all)."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    matched_stop: str | None = None
    matched_stop_token_id: int | None = None
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_parse_error: bool = False
    choices: tuple["Completion", ...] = ()
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None
    prompt_token_ids: list[int] | None = None  # on every choice (return_prompt_token_ids=True)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    tensor_parallel_size: int
    has_chat_template: bool


@dataclass(frozen=True, slots=True)
class Detokenized:
    text: str  # the ids decoded together
    token_texts: list[str]  # each id decoded alone, special tokens included


def to_chunk(response: frontend_pb2.GenerateResponse | frontend_pb2.ChatResponse) -> Chunk:
    finished = response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
    return Chunk(
        text=response.text,
        token_ids=list(response.token_ids),
        finish_reason=FINISH_REASONS.get(response.finish_reason) if finished else None,
        usage=Usage(
            response.usage.prompt_tokens,
            response.usage.completion_tokens,
            response.usage.cached_tokens,
        )
        if finished and response.HasField("usage")  # n > 1: on the call's last message only
        else None,
        matched_stop=response.matched_stop or None,
        matched_stop_token_id=response.matched_stop_token_id
        if response.HasField("matched_stop_token_id")
        else None,
        index=response.index,
        logprobs=_logprobs(response.logprobs),
        prompt_logprobs=_logprobs(response.prompt_logprobs),
        prompt_token_ids=list(response.prompt_token_ids) or None,  # never empty when asked
        **_chat_fields(response),
    )


def _logprobs(entries: Sequence[common_pb2.TokenLogprobs]) -> list[TokenLogprobs] | None:
    if not entries:
        return None
    return [
        TokenLogprobs(
            e.token_id,
            e.logprob,
            e.rank,
            e.text,
            [Logprob(t.token_id, t.logprob, t.text) for t in e.top_logprobs],
        )
        for e in entries
    ]


def _chat_fields(response: frontend_pb2.GenerateResponse | frontend_pb2.ChatResponse) -> dict:
    if not isinstance(response, frontend_pb2.ChatResponse):
        return {}
    return {
        "reasoning_content": response.reasoning_content,
        "tool_calls": tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in response.tool_calls
        ),
        "tool_call_parse_error": response.tool_call_parse_error,
    }


def join_chunks(chunks: Iterable[Chunk]) -> Completion:
    """The chunks of a call, grouped by completion index (n > 1) and concatenated."""
    texts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    token_ids: dict[int, list[int]] = {}
    tool_calls: dict[int, list[ToolCall]] = {}
    parse_error: set[int] = set()
    logprobs: dict[int, list[TokenLogprobs]] = {}
    prompt_logprobs: list[TokenLogprobs] | None = None
    prompt_token_ids: list[int] | None = None
    lasts: dict[int, Chunk] = {}
    usage = None
    for chunk in chunks:
        texts.setdefault(chunk.index, []).append(chunk.text)
        reasoning.setdefault(chunk.index, []).append(chunk.reasoning_content)
        token_ids.setdefault(chunk.index, []).extend(chunk.token_ids)
        tool_calls.setdefault(chunk.index, []).extend(chunk.tool_calls)
        if chunk.logprobs:
            logprobs.setdefault(chunk.index, []).extend(chunk.logprobs)
        if chunk.prompt_logprobs:  # a long prompt's come in several chunks (frontend bound)
            if prompt_logprobs is None:
                prompt_logprobs = []
            prompt_logprobs.extend(chunk.prompt_logprobs)
        if chunk.prompt_token_ids is not None:
            prompt_token_ids = chunk.prompt_token_ids
        if chunk.tool_call_parse_error:
            parse_error.add(chunk.index)
        if chunk.finish_reason is not None:
            lasts[chunk.index] = chunk
        usage = chunk.usage or usage  # the call's last message carries it
    if not texts or usage is None or set(lasts) != set(texts):
        raise ServiceError("the stream ended without a finish reason")
    choices = []
    for index in sorted(texts):
        last = lasts[index]
        assert last.finish_reason is not None  # only finished chunks are in lasts
        choices.append(
            Completion(
                "".join(texts[index]),
                token_ids[index],
                last.finish_reason,
                usage,
                last.matched_stop,
                last.matched_stop_token_id,
                "".join(reasoning[index]),
                tuple(tool_calls[index]),
                index in parse_error,
                (),
                logprobs.get(index),
                prompt_logprobs if index == 0 else None,
                prompt_token_ids,
            )
        )
    if len(choices) == 1:
        return choices[0]
    first = choices[0]
    return Completion(
        first.text,
        first.token_ids,
        first.finish_reason,
        usage,
        first.matched_stop,
        first.matched_stop_token_id,
        first.reasoning_content,
        first.tool_calls,
        first.tool_call_parse_error,
        tuple(choices),
        first.logprobs,
        first.prompt_logprobs,
        first.prompt_token_ids,
    )


def _detokenized(response: frontend_pb2.DetokenizeResponse) -> Detokenized:
    return Detokenized(response.text, list(response.token_texts))


def _model_info(response: frontend_pb2.GetModelInfoResponse) -> ModelInfo:
    return ModelInfo(
        response.model_name,
        response.max_model_len,
        response.vocab_size,
        list(response.eos_token_ids),
        response.tensor_parallel_size,
        response.has_chat_template,
    )
