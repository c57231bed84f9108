"""The Python client's requests: FrontendService messages built from plain arguments (vLLM's
sampling names, OpenAI's chat and tool shapes). nanoserve.client sends them; nanoserve.client_messages
reads the answers."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from nanoserve.client_messages import ChatMessages, ToolCall, Tools
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2

# GenerateRequest/ChatRequest.stream_interval: tokens a response message may wait for (the
# frontend refuses more; the gateway asks for it when the caller wants the whole reply)
MAX_STREAM_INTERVAL = 256
_SAMPLING_FIELDS = frozenset(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)


def sampling_params(**kwargs: Any) -> common_pb2.SamplingParams:
    """SamplingParams from vLLM-named keyword arguments; `stop` may be one string, `logit_bias`
    a {token id: bias} dict whose ids may be strings (OpenAI's JSON shape)."""
    unknown = set(kwargs) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    if isinstance(kwargs.get("stop"), str):
        kwargs["stop"] = [kwargs["stop"]]
    if isinstance(kwargs.get("logit_bias"), Mapping):
        kwargs["logit_bias"] = {int(k): v for k, v in kwargs["logit_bias"].items()}
    if isinstance(kwargs.get("logprobs_mode"), str):  # "raw" or "processed"
        kwargs["logprobs_mode"] = common_pb2.LogprobsMode.Value(
            f"LOGPROBS_MODE_{kwargs['logprobs_mode'].upper()}"
        )
    if isinstance(kwargs.get("structured_output"), Mapping):
        kwargs["structured_output"] = structured_output(**kwargs["structured_output"])
    return common_pb2.SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})


def structured_output(
    json_schema: Mapping[str, Any] | bool | str | None = None,
    regex: str | None = None,
    grammar: str | None = None,
    json_object: bool = False,
    structural_tag: Mapping[str, Any] | str | None = None,
) -> common_pb2.StructuredOutput:
    """What the output must match, exactly one of: a JSON Schema (a dict, or its JSON text), a
    regex, an EBNF grammar (GBNF dialect, rule `root`), any JSON object, or an xgrammar structural
    tag (a dict, or its JSON text). Passed to the calls as
    `structured_output={"json_schema": {...}}` (this dict's keywords) or this message."""
    given = [v is not None for v in (json_schema, regex, grammar, structural_tag)]
    if sum(given) + bool(json_object) != 1:
        raise ValueError(
            "structured_output: give exactly one of json_schema, regex, grammar, json_object, "
            "structural_tag"
        )
    if json_object:
        return common_pb2.StructuredOutput(json_object=True)
    if regex is not None:
        return common_pb2.StructuredOutput(regex=regex)
    if grammar is not None:
        return common_pb2.StructuredOutput(grammar=grammar)
    if structural_tag is not None:
        return common_pb2.StructuredOutput(structural_tag=_json_text(structural_tag))
    schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
    return common_pb2.StructuredOutput(json_schema=schema)


def generate_request(
    prompt: str | Sequence[int],
    request_id: str = "",
    add_special_tokens: bool | None = None,
    priority: int | None = None,
    *,
    stream_interval: int | None = None,
    **sampling: Any,
) -> frontend_pb2.GenerateRequest:
    """stream_interval: after the first token, one message per this many tokens (1..256)."""
    request = frontend_pb2.GenerateRequest(
        request_id=request_id,
        sampling_params=sampling_params(**sampling),
        priority=priority,
        stream_interval=stream_interval,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tool_call(call: ToolCall | Mapping[str, Any]) -> frontend_pb2.ToolCall:
    if isinstance(call, ToolCall):
        call = call.to_dict()
    function = call.get("function", {})
    return frontend_pb2.ToolCall(
        id=call.get("id", ""),
        type=call.get("type", "function"),
        function=frontend_pb2.ToolCallFunction(
            name=function.get("name", ""), arguments=_json_text(function.get("arguments", {}))
        ),
    )


def _chat_message(message: Mapping[str, Any] | tuple[str, str]) -> frontend_pb2.ChatMessage:
    if not isinstance(message, Mapping):
        role, content = message
        return frontend_pb2.ChatMessage(role=role, content=content)
    return frontend_pb2.ChatMessage(
        role=message["role"],
        content=message.get("content") or "",
        tool_calls=[_tool_call(c) for c in message.get("tool_calls") or ()],
        tool_call_id=message.get("tool_call_id") or "",
        name=message.get("name") or "",
        reasoning_content=message.get("reasoning_content") or "",
    )


def _tool(tool: Mapping[str, Any]) -> frontend_pb2.Tool:
    function = tool.get("function", {})
    parameters = function.get("parameters")
    return frontend_pb2.Tool(
        type=tool.get("type", "function"),
        function=frontend_pb2.ToolFunction(
            name=function.get("name", ""),
            description=function.get("description") or "",
            parameters="" if parameters is None else _json_text(parameters),
        ),
    )


def chat_request(
    messages: ChatMessages,
    request_id: str = "",
    enable_thinking: bool | None = None,
    priority: int | None = None,
    *,
    tools: Tools | None = None,
    tool_choice: str = "",
    tool_choice_function: str = "",
    parallel_tool_calls: bool | None = None,
    separate_reasoning: bool | None = None,
    stream_interval: int | None = None,
    **sampling: Any,
) -> frontend_pb2.ChatRequest:
    request = frontend_pb2.ChatRequest(
        request_id=request_id,
        sampling_params=sampling_params(**sampling),
        priority=priority,
        stream_interval=stream_interval,
        messages=[_chat_message(m) for m in messages],
        tools=[_tool(t) for t in tools or ()],
        tool_choice=tool_choice,
        tool_choice_function=tool_choice_function,
    )
    if enable_thinking is not None:
        request.enable_thinking = enable_thinking
    if separate_reasoning is not None:
        request.separate_reasoning = separate_reasoning
    if parallel_tool_calls is not None:
        request.parallel_tool_calls = parallel_tool_calls
    return request


def tokenize_request(text: str, add_special_tokens: bool | None) -> frontend_pb2.TokenizeRequest:
    request = frontend_pb2.TokenizeRequest(text=text)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def detokenize_request(
    token_ids: Sequence[int], skip_special_tokens: bool | None
) -> frontend_pb2.DetokenizeRequest:
    request = frontend_pb2.DetokenizeRequest(token_ids=token_ids)
    if skip_special_tokens is not None:
        request.skip_special_tokens = skip_special_tokens
    return request
