"""OpenAI request -> gRPC request, table-driven: SAMPLING maps each parameter the gRPC API serves to
its SamplingParams field (the client's sampling_proto.to_proto takes OpenAI's shapes); NOT_YET lists
those it does not serve (functions, function_call), with the values that change nothing
(functions=[], ...), any other value a 400 naming the parameter. logprobs, response_format and the
vLLM structured-output extras have their own rules (output_params.py), echo, best_of and suffix too
(completion_params.py); tools and messages too.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nanoserve.frontend.gateway.completion_params import BestOf, Echo, map_completion_extras
from nanoserve.frontend.gateway.errors import bad_param
from nanoserve.frontend.gateway.output_params import map_logprobs, map_structured_output
from nanoserve.frontend.gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    NamedToolChoice,
    OpenAIRequest,
)
from nanoserve.sampling import SCHEMA

# OpenAI (or vLLM extra) parameter -> SamplingParams field: the schema's own names, and chat's newer
# name of max_tokens (after it: a body with both is refused naming max_completion_tokens); logprobs
# and structured_output have their own rules (output_params.py)
SAMPLING: dict[str, str] = {
    f.name: f.name for f in SCHEMA if f.name not in ("logprobs", "structured_output")
} | {"max_completion_tokens": "max_tokens"}


# Not in the gRPC API -> is this value a no-op (served as if absent)?
NOT_YET: dict[str, Callable[[Any], bool]] = {
    "functions": lambda v: v == [],
    "function_call": lambda v: v == "none",
}
ROLES = {"developer": "system"}  # OpenAI's newer name of the system role


@dataclass
class Mapped:
    """A request in the gRPC API's terms: client method keyword arguments (`sampling`, then the
    call's own: priority, tools, ...), plus, for errors, the OpenAI name of each gRPC field the
    caller set (`sampling_params.max_tokens` -> `max_tokens`)."""

    sampling: dict[str, Any] = field(default_factory=dict)
    call: dict[str, Any] = field(default_factory=dict)
    param_names: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    logprobs: bool = False  # the reply carries choices[].logprobs
    token_ids: bool = False  # return_token_ids: the reply carries token_ids, prompt_token_ids
    echo: Echo | None = None  # completions' echo: true (echo.py applies it)
    best_of: BestOf | None = None  # completions' best_of > n (best_of.py applies it)

    def kwargs(self) -> dict[str, Any]:
        return {**self.sampling, **self.call}


def _map_common(request: OpenAIRequest) -> Mapped:
    given = {k: v for k, v in request if v is not None}
    for name, no_op in NOT_YET.items():
        if name in given and not no_op(given[name]):
            raise bad_param(name, f"{given[name]!r} is not supported by this server yet")
    options = request.stream_options
    if options is not None and options.continuous_usage_stats:
        raise bad_param("stream_options.continuous_usage_stats", "is not supported")
    if options is not None and not request.stream:
        raise bad_param("stream_options", "is only allowed with stream: true")
    mapped = Mapped(
        stream=bool(request.stream),
        include_usage=bool(options is not None and options.include_usage),
        n=request.n if request.n is not None else 1,
    )
    for name, target in SAMPLING.items():
        if name not in given:
            continue
        if target in mapped.sampling:
            raise bad_param(name, f"give one of the parameters that set {target}, not both")
        mapped.sampling[target] = given[name]  # shapes (stop as one string, ...): sampling_proto
        mapped.param_names[f"sampling_params.{target}"] = name
    structured = map_structured_output(request)
    if structured is not None:
        name, spec = structured
        mapped.sampling["structured_output"] = spec
        for kind in ("", ".json_schema", ".regex", ".grammar", ".json_object"):
            mapped.param_names[f"sampling_params.structured_output{kind}"] = name
    if request.priority is not None:
        mapped.call["priority"] = request.priority
        mapped.param_names["priority"] = "priority"
    if request.return_token_ids:
        mapped.token_ids = mapped.call["return_prompt_token_ids"] = True
    return mapped


# /v1/completions without max_tokens: OpenAI's and vLLM's default (chat leaves it unset: the rest
# of the context, as both do there)
COMPLETION_DEFAULT_MAX_TOKENS = 16


def map_completion(request: CompletionRequest) -> tuple[str | list[int], Mapped]:
    """The prompt (text or token ids) and the rest of a /v1/completions request."""
    mapped = _map_common(request)
    if request.max_tokens is None:
        mapped.sampling["max_tokens"] = COMPLETION_DEFAULT_MAX_TOKENS
    prompt: Any = request.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise bad_param("prompt", f"a batch of {len(prompt)} prompts is not supported yet")
        prompt = prompt[0]
        if isinstance(prompt, list) and not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt
        ):
            raise bad_param("prompt", "must be text or a list of token ids")
        if not isinstance(prompt, (str, list)):
            raise bad_param("prompt", "must be text or a list of token ids")
    if isinstance(prompt, list) and not prompt:
        raise bad_param("prompt", "must not be empty")
    mapped.param_names.update({"prompt": "prompt", "prompt_token_ids": "prompt"})
    if request.logprobs is not None:
        mapped.sampling["logprobs"], mapped.logprobs = request.logprobs, True
        mapped.param_names["sampling_params.logprobs"] = "logprobs"
    mapped.echo, mapped.best_of = map_completion_extras(
        request, prompt, mapped.sampling, mapped.param_names
    )
    return prompt, mapped


def _content(message: ChatMessage, i: int) -> str:
    """A message's text: the string, or its text parts joined (none: an assistant's tool calls)."""
    if message.content is None:
        if message.role == "assistant" and message.tool_calls:
            return ""
        raise bad_param(f"messages[{i}].content", "is required")
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_param(f"messages[{i}].content[{j}]", "only text parts are supported")
        texts.append(part["text"])
    return "".join(texts)


def _message(message: ChatMessage, i: int) -> dict[str, Any]:
    """One message as the client's dict (OpenAI's shape; the frontend checks roles and fields)."""
    extra = sorted(message.model_extra or {})
    if extra:
        raise bad_param(f"messages[{i}].{extra[0]}", "is not supported by this server")
    out: dict[str, Any] = {
        "role": ROLES.get(message.role, message.role),
        "content": _content(message, i),
    }
    for name in ("name", "tool_call_id", "reasoning_content"):
        if getattr(message, name) is not None:
            out[name] = getattr(message, name)
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return out


def _map_tools(request: ChatCompletionRequest, mapped: Mapped) -> None:
    """tools, tool_choice and parallel_tool_calls onto the Chat call's arguments: a named function
    becomes tool_choice_function (it must be one of `tools`); "required" and a named function are
    forced by the frontend. parallel_tool_calls goes as it is, for every tool_choice: false is at
    most one call (the frontend's "required" makes exactly one, "auto" keeps the first)."""
    choice = request.tool_choice
    names = [tool.function.name for tool in request.tools or ()]
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise bad_param("tool_choice", f"no tool named {choice.function.name!r} in tools")
        mapped.call["tool_choice_function"] = choice.function.name
    elif choice is not None:
        mapped.call["tool_choice"] = choice
    if request.parallel_tool_calls is not None:
        mapped.call["parallel_tool_calls"] = request.parallel_tool_calls
        mapped.param_names["parallel_tool_calls"] = "parallel_tool_calls"
    if request.tools:
        mapped.call["tools"] = [tool.model_dump(exclude_none=True) for tool in request.tools]
        mapped.param_names["tools"] = "tools"
    if choice is not None:
        mapped.param_names["tool_choice"] = "tool_choice"
        mapped.param_names["tool_choice_function"] = "tool_choice"


def map_chat(request: ChatCompletionRequest) -> tuple[list[dict[str, Any]], Mapped]:
    """The messages as the client's dicts, and the rest of a chat request (enable_thinking,
    separate_reasoning, tools and priority in Mapped.call)."""
    mapped = _map_common(request)
    messages = [_message(message, i) for i, message in enumerate(request.messages)]
    mapped.param_names["messages"] = "messages"
    map_logprobs(request, mapped.sampling, mapped.param_names)
    mapped.logprobs = "logprobs" in mapped.sampling
    _map_tools(request, mapped)
    kwargs = request.chat_template_kwargs
    if kwargs is not None and kwargs.enable_thinking is not None:
        mapped.call["enable_thinking"] = kwargs.enable_thinking
    if request.separate_reasoning is not None:
        mapped.call["separate_reasoning"] = request.separate_reasoning
    return messages, mapped
