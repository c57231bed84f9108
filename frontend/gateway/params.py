"""OpenAI request -> gRPC request, table-driven: SAMPLING maps each parameter the gRPC API serves to
its SamplingParams field; NOT_YET lists those it does not serve yet, with the values that change
nothing (n=1, logprobs=false, ...), any other value a 400 naming the parameter. A parameter the gRPC
API gains (n, logprobs, response_format, tools) moves from NOT_YET to SAMPLING: one line each.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nanoserve.frontend.gateway.errors import bad_param
from nanoserve.frontend.gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    OpenAIRequest,
)

# OpenAI (or vLLM extra) parameter -> SamplingParams field.
SAMPLING: dict[str, str] = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",  # chat's newer name of max_tokens
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "stop_token_ids": "stop_token_ids",
}
# Value conversions on the way (OpenAI allows `stop` as one string).
CONVERT: dict[str, Callable[[Any], Any]] = {
    "stop": lambda v: [v] if isinstance(v, str) else list(v),
}
# Not in the gRPC API yet -> is this value a no-op (served as if absent)?
NOT_YET: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1,
    "best_of": lambda v: v == 1,
    "logprobs": lambda v: v is False,
    "top_logprobs": lambda v: v == 0,
    "prompt_logprobs": lambda v: False,
    "echo": lambda v: v is False,
    "suffix": lambda v: v == "",
    "logit_bias": lambda v: v == {},
    "response_format": lambda v: isinstance(v, Mapping) and v.get("type") == "text",
    "tools": lambda v: v == [],
    "tool_choice": lambda v: v == "none",
    "parallel_tool_calls": lambda v: isinstance(v, bool),
    "functions": lambda v: v == [],
    "function_call": lambda v: v == "none",
}
ROLES = {"developer": "system"}  # OpenAI's newer name of the system role


@dataclass
class Mapped:
    """A request in the gRPC API's terms: client method keyword arguments, plus, for errors, the
    OpenAI name of each gRPC field the caller set (`sampling_params.max_tokens` -> `max_tokens`)."""

    sampling: dict[str, Any] = field(default_factory=dict)
    param_names: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False


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
    )
    for name, target in SAMPLING.items():
        if name not in given:
            continue
        if target in mapped.sampling:
            raise bad_param(name, f"give one of the parameters that set {target}, not both")
        mapped.sampling[target] = CONVERT.get(name, lambda v: v)(given[name])
        mapped.param_names[f"sampling_params.{target}"] = name
    return mapped


def map_completion(request: CompletionRequest) -> tuple[str | list[int], Mapped]:
    """The prompt (text or token ids) and the rest of a /v1/completions request."""
    mapped = _map_common(request)
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
    return prompt, mapped


def _content(message: ChatMessage, i: int) -> str:
    """A message's text: the string, or its text parts joined."""
    if message.content is None:
        raise bad_param(f"messages[{i}].content", "is required")
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_param(f"messages[{i}].content[{j}]", "only text parts are supported")
        texts.append(part["text"])
    return "".join(texts)


def map_chat(request: ChatCompletionRequest) -> tuple[list[tuple[str, str]], bool | None, Mapped]:
    """The messages as (role, content), enable_thinking, and the rest of a chat request."""
    mapped = _map_common(request)
    messages = []
    for i, message in enumerate(request.messages):
        extra = sorted(message.model_extra or {})
        if extra:
            raise bad_param(f"messages[{i}].{extra[0]}", "is not supported by this server yet")
        messages.append((ROLES.get(message.role, message.role), _content(message, i)))
    mapped.param_names["messages"] = "messages"
    kwargs = request.chat_template_kwargs
    return messages, (kwargs.enable_thinking if kwargs is not None else None), mapped
