"""The Python client's messages: FrontendService requests built from plain arguments, and the
results (Chunk, Completion, ModelInfo) read from its responses. nanoserve.client sends them."""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.errors import ServiceError
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2

DEFAULT_ADDRESS = "127.0.0.1:50051"
SERVICE_NAME = "nanoserve.v1.FrontendService"
_FINISH_REASONS = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}
_SAMPLING_FIELDS = frozenset(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)

ChatMessages = Iterable[Mapping[str, str] | tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed message: a text delta (valid UTF-8) and the new token ids."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # None while running, then "stop" or "length"
    usage: Usage | None = None  # last chunk only
    matched_stop: str | None = None
    matched_stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole request's output, the concatenation of its chunks."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    matched_stop: str | None = None
    matched_stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    tensor_parallel_size: int
    has_chat_template: bool


def sampling_params(**kwargs: Any) -> common_pb2.SamplingParams:
    """SamplingParams from vLLM-named keyword arguments; `stop` may be one string."""
    unknown = set(kwargs) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    if isinstance(kwargs.get("stop"), str):
        kwargs["stop"] = [kwargs["stop"]]
    if isinstance(kwargs.get("structured_output"), Mapping):
        kwargs["structured_output"] = structured_output(**kwargs["structured_output"])
    return common_pb2.SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})


def structured_output(
    json_schema: Mapping[str, Any] | bool | str | None = None,
    regex: str | None = None,
    grammar: str | None = None,
    json_object: bool = False,
) -> common_pb2.StructuredOutput:
    """What the output must match, exactly one of: a JSON Schema (a dict, or its JSON text), a
    regex, an EBNF grammar (GBNF dialect, rule `root`), or any JSON object. Passed to the calls
    as `structured_output={"json_schema": {...}}` (this dict's keywords) or this message."""
    given = [v is not None for v in (json_schema, regex, grammar)]
    if sum(given) + bool(json_object) != 1:
        raise ValueError(
            "structured_output: give exactly one of json_schema, regex, grammar, json_object"
        )
    if json_object:
        return common_pb2.StructuredOutput(json_object=True)
    if regex is not None:
        return common_pb2.StructuredOutput(regex=regex)
    if grammar is not None:
        return common_pb2.StructuredOutput(grammar=grammar)
    schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
    return common_pb2.StructuredOutput(json_schema=schema)


def generate_request(
    prompt: str | Sequence[int],
    request_id: str = "",
    add_special_tokens: bool | None = None,
    **sampling: Any,
) -> frontend_pb2.GenerateRequest:
    request = frontend_pb2.GenerateRequest(
        request_id=request_id, sampling_params=sampling_params(**sampling)
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def chat_request(
    messages: ChatMessages,
    request_id: str = "",
    enable_thinking: bool | None = None,
    **sampling: Any,
) -> frontend_pb2.ChatRequest:
    request = frontend_pb2.ChatRequest(
        request_id=request_id, sampling_params=sampling_params(**sampling)
    )
    for message in messages:
        role, content = (
            (message["role"], message["content"]) if isinstance(message, Mapping) else message
        )
        request.messages.add(role=role, content=content)
    if enable_thinking is not None:
        request.enable_thinking = enable_thinking
    return request


def to_chunk(response: frontend_pb2.GenerateResponse | frontend_pb2.ChatResponse) -> Chunk:
    finished = response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
    return Chunk(
        text=response.text,
        token_ids=list(response.token_ids),
        finish_reason=_FINISH_REASONS.get(response.finish_reason) if finished else None,
        usage=Usage(
            response.usage.prompt_tokens,
            response.usage.completion_tokens,
            response.usage.cached_tokens,
        )
        if finished
        else None,
        matched_stop=response.matched_stop or None,
        matched_stop_token_id=response.matched_stop_token_id
        if response.HasField("matched_stop_token_id")
        else None,
    )


def join_chunks(chunks: Iterable[Chunk]) -> Completion:
    texts: list[str] = []
    token_ids: list[int] = []
    last = None
    for chunk in chunks:
        texts.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        last = chunk
    if last is None or last.finish_reason is None or last.usage is None:
        raise ServiceError("the stream ended without a finish reason")
    return Completion(
        "".join(texts),
        token_ids,
        last.finish_reason,
        last.usage,
        last.matched_stop,
        last.matched_stop_token_id,
    )


def tokenize_request(text: str, add_special_tokens: bool | None) -> frontend_pb2.TokenizeRequest:
    request = frontend_pb2.TokenizeRequest(text=text)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def _model_info(response: frontend_pb2.GetModelInfoResponse) -> ModelInfo:
    return ModelInfo(
        response.model_name,
        response.max_model_len,
        response.vocab_size,
        list(response.eos_token_ids),
        response.tensor_parallel_size,
        response.has_chat_template,
    )
