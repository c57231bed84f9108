"""Turns a ChatRequest into the chat template's inputs: messages and tools as the JSON-like dicts
transformers' apply_chat_template takes (OpenAI's shapes), each field checked and bounded first,
and a forced tool_choice into the calls the reply must make (frontend.chat.tool_choice).

The servicer calls chat_inputs() before admission; Tokenizer.apply_chat_template renders the result.
"""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.errors import InvalidArgument, echo
from nanoserve.frontend.admission import Limits, validate_messages
from nanoserve.frontend.chat.tool_choice import ForcedTools, arguments_schema
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.structured_output import from_proto as structured_output_from_proto

MAX_TOOLS = 128
MAX_TOOL_CALLS_PER_MESSAGE = 128
MAX_TOOL_NAME_LENGTH = 64  # OpenAI's limit
MAX_TOOL_CALL_ID_LENGTH = 128
MAX_TOOL_SCHEMA_BYTES = 64 * 1024  # one tool's parameters, or one call's arguments
MAX_TOOL_CHOICE_LENGTH = 16
# "required" and "function" (tool_choice_function) force calls; "" is "auto", or "function" when
# tool_choice_function is set
TOOL_CHOICES = ("auto", "none", "required", "function")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class ChatInputs:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # None: the template renders no tools section
    parse_tool_calls: bool  # the reply's <tool_call> blocks become ChatResponse.tool_calls
    forced: ForcedTools | None = None  # the calls the reply must make (constrained decoding)
    single_call: bool = False  # parallel_tool_calls false: the parser keeps the first call only

    @property
    def size(self) -> int:
        """Characters the template will render, about: for Tokenizer's large-encode gate."""
        return sum(len(m["content"]) for m in self.messages) + len(json.dumps(self.tools or []))


class _Budget:
    """The bytes of every string a request sends besides the contents (which validate_messages
    counts), held to max_prompt_bytes in total."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, text: str, field: str, most: int | None = None) -> None:
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if most is not None and size > most:
            raise InvalidArgument(f"{size} bytes > {most}", field=field)
        self.used += size
        if self.used > self.limit:
            raise InvalidArgument(
                f"the request's texts total more than max_prompt_bytes ({self.limit})", field=field
            )


def _name(name: str, field: str) -> str:
    if not 0 < len(name) <= MAX_TOOL_NAME_LENGTH or not _TOOL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"must be 1-{MAX_TOOL_NAME_LENGTH} letters, digits, '_' or '-', got {echo(name)}",
            field=field,
        )
    return name


def _json_object(text: str, field: str) -> dict[str, Any]:
    """A JSON object from a string already bounded in size (nesting too deep is refused too)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidArgument(f"not valid JSON: {str(e)[:200]}", field=field) from None
    if not isinstance(value, dict):
        raise InvalidArgument("must be a JSON object", field=field)
    return value


def _function_type(value: str, field: str) -> None:
    if value not in ("", "function"):
        raise InvalidArgument(f'must be "function", got {echo(value)}', field=field)


def _tools(tools: Sequence[frontend_pb2.Tool], budget: _Budget) -> list[dict[str, Any]]:
    if len(tools) > MAX_TOOLS:
        raise InvalidArgument(f"at most {MAX_TOOLS} tools, got {len(tools)}", field="tools")
    rendered = []
    for i, tool in enumerate(tools):
        field = f"tools[{i}]"
        _function_type(tool.type, f"{field}.type")
        function: dict[str, Any] = {"name": _name(tool.function.name, f"{field}.function.name")}
        if tool.function.description:
            budget.take(tool.function.description, f"{field}.function.description")
            function["description"] = tool.function.description
        if tool.function.parameters:
            where = f"{field}.function.parameters"
            budget.take(tool.function.parameters, where, MAX_TOOL_SCHEMA_BYTES)
            function["parameters"] = _json_object(tool.function.parameters, where)
        rendered.append({"type": "function", "function": function})
    return rendered


def _message(message: frontend_pb2.ChatMessage, field: str, budget: _Budget) -> dict[str, Any]:
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role != "assistant" and (message.tool_calls or message.reasoning_content):
        what = "tool_calls" if message.tool_calls else "reasoning_content"
        raise InvalidArgument("only an assistant message has it", field=f"{field}.{what}")
    if message.role != "tool" and (message.tool_call_id or message.name):
        what = "tool_call_id" if message.tool_call_id else "name"
        raise InvalidArgument("only a tool message has it", field=f"{field}.{what}")
    if message.reasoning_content:
        budget.take(message.reasoning_content, f"{field}.reasoning_content")
        rendered["reasoning_content"] = message.reasoning_content
    if len(message.tool_calls) > MAX_TOOL_CALLS_PER_MESSAGE:
        raise InvalidArgument(
            f"at most {MAX_TOOL_CALLS_PER_MESSAGE} tool calls, got {len(message.tool_calls)}",
            field=f"{field}.tool_calls",
        )
    calls = []
    for j, call in enumerate(message.tool_calls):
        where = f"{field}.tool_calls[{j}]"
        if len(call.id) > MAX_TOOL_CALL_ID_LENGTH:
            raise InvalidArgument(f"longer than {MAX_TOOL_CALL_ID_LENGTH}", field=f"{where}.id")
        _function_type(call.type, f"{where}.type")
        name = _name(call.function.name, f"{where}.function.name")
        arguments = call.function.arguments or "{}"
        budget.take(arguments, f"{where}.function.arguments", MAX_TOOL_SCHEMA_BYTES)
        # Parsed, as vLLM does: the template writes an object back with its own tojson.
        parsed = _json_object(arguments, f"{where}.function.arguments")
        function = {"name": name, "arguments": parsed}
        calls.append({"id": call.id, "type": "function", "function": function})
    if calls:
        rendered["tool_calls"] = calls
    if message.tool_call_id:
        if len(message.tool_call_id) > MAX_TOOL_CALL_ID_LENGTH:
            raise InvalidArgument(
                f"longer than {MAX_TOOL_CALL_ID_LENGTH}", field=f"{field}.tool_call_id"
            )
        rendered["tool_call_id"] = message.tool_call_id
    if message.name:
        rendered["name"] = _name(message.name, f"{field}.name")
    return rendered


def _forced_tools(
    request: frontend_pb2.ChatRequest, tools: list[dict[str, Any]], single_call: bool
) -> ForcedTools | None:
    """The calls a tool_choice "required" or a named function forces, or None ("auto", "none").
    A named function is called once; "required" once too with `single_call`
    (parallel_tool_calls false), else one or more times."""
    choice, name = request.tool_choice, request.tool_choice_function
    if name and choice not in ("", "function"):
        raise InvalidArgument(
            f'set it with tool_choice "" or "function", not {choice!r}',
            field="tool_choice_function",
        )
    if choice == "function" and not name:
        raise InvalidArgument(
            'is required with tool_choice "function"', field="tool_choice_function"
        )
    if choice != "required" and not name:
        return None
    if not tools:
        raise InvalidArgument(
            "forcing a tool call needs at least one of `tools`", field="tool_choice"
        )
    if structured_output_from_proto(request.sampling_params.structured_output) is not None:
        raise InvalidArgument(
            "give a structured output or a forced tool_choice, not both",
            field="sampling_params.structured_output",
        )
    if name:
        _name(name, "tool_choice_function")
        chosen = [i for i, tool in enumerate(tools) if tool["function"]["name"] == name]
        if not chosen:
            raise InvalidArgument(f"no tool named {name!r} in tools", field="tool_choice_function")
    else:
        chosen = list(range(len(tools)))
    calls = []
    for i in chosen:
        function = tools[i]["function"]
        where = f"tools[{i}].function.parameters"
        calls.append((function["name"], arguments_schema(function.get("parameters"), where)))
    field = f"tools[{chosen[0]}].function.parameters" if len(chosen) == 1 else "tools"
    return ForcedTools(calls, exactly_one=bool(name) or single_call, field=field)


def chat_inputs(request: frontend_pb2.ChatRequest, limits: Limits) -> ChatInputs:
    """Checks the request's messages, tools and tool_choice; INVALID_ARGUMENT names the field."""
    validate_messages(request.messages, limits)  # counted and sized before any is read
    if len(request.tool_choice) > MAX_TOOL_CHOICE_LENGTH or request.tool_choice not in (
        "",
        *TOOL_CHOICES,
    ):
        raise InvalidArgument(
            f"must be one of {list(TOOL_CHOICES)}, got {echo(request.tool_choice)}",
            field="tool_choice",
        )
    budget = _Budget(limits.max_prompt_bytes)
    tools = _tools(request.tools, budget)
    # unset is true (OpenAI's default); "none" parses no calls, so false changes nothing there
    single_call = request.HasField("parallel_tool_calls") and not request.parallel_tool_calls
    forced = _forced_tools(request, tools, single_call)
    messages = [_message(m, f"messages[{i}]", budget) for i, m in enumerate(request.messages)]
    use_tools = bool(tools) and request.tool_choice != "none"
    return ChatInputs(messages, tools if use_tools else None, use_tools, forced, single_call)
