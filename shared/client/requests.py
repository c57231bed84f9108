"""The Python client's requests: FrontendService messages built from plain arguments (vLLM's
sampling names, OpenAI's chat and tool shapes). nanoserve.client sends them; nanoserve.client.messages
reads the answers."""

from collections.abc import Mapping, Sequence
from typing import Any

from nanoserve.client.messages import ChatMessages, ToolCall, Tools
from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.sampling import SamplingError
from nanoserve.sampling_proto import (  # noqa: F401 - structured_output: nanoserve.client's
    json_text,
    structured_output,
    to_proto,
)


def sampling_params(**kwargs: Any) -> common_pb2.SamplingParams:
    """SamplingParams from vLLM-named keyword arguments (sampling_proto.to_proto); a value that
    cannot be sent is refused as the frontend would refuse it, naming the field."""
    try:
        return to_proto(**kwargs)
    except SamplingError as e:
        raise InvalidArgument(e.problem, field=f"sampling_params.{e.field}") from None


def generate_request(
    prompt: str | Sequence[int],
    request_id: str = "",
    add_special_tokens: bool | None = None,
    priority: int | None = None,
    *,
    stream_interval: int | None = None,
    return_prompt_token_ids: bool | None = None,
    **sampling: Any,
) -> frontend_pb2.GenerateRequest:
    """stream_interval: after the first token, one message per this many tokens (1..256);
    return_prompt_token_ids: the first chunk carries the prompt's ids."""
    request = frontend_pb2.GenerateRequest(
        request_id=request_id,
        sampling_params=sampling_params(**sampling),
        priority=priority,
        stream_interval=stream_interval,
        return_prompt_token_ids=return_prompt_token_ids,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def _tool_call(call: ToolCall | Mapping[str, Any]) -> frontend_pb2.ToolCall:
    if isinstance(call, ToolCall):
        call = call.to_dict()
    function = call.get("function", {})
    return frontend_pb2.ToolCall(
        id=call.get("id", ""),
        type=call.get("type", "function"),
        function=frontend_pb2.ToolCallFunction(
            name=function.get("name", ""), arguments=json_text(function.get("arguments", {}))
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
            parameters="" if parameters is None else json_text(parameters),
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
    return_prompt_token_ids: bool | None = None,
    **sampling: Any,
) -> frontend_pb2.ChatRequest:
    request = frontend_pb2.ChatRequest(
        request_id=request_id,
        sampling_params=sampling_params(**sampling),
        priority=priority,
        stream_interval=stream_interval,
        return_prompt_token_ids=return_prompt_token_ids,
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
