"""Forced tool choice: tool_choice "required" or a named function becomes an xgrammar structural tag
(StructuredOutput.structural_tag) that the worker compiles, so the reply can only be Qwen3's
`<tool_call>` blocks, each call's arguments valid against its tool's parameters schema.

chat_request.chat_inputs picks the calls (ForcedTools); the servicer, once the prompt is rendered,
calls constrained_params() with what the prompt says about thinking (chat_output.think_in_prompt).
"""

import json
from dataclasses import dataclass
from typing import Any

from nanoserve.errors import InvalidArgument
from nanoserve.frontend.chat.output import ThinkState
from nanoserve.frontend.chat.reasoning import THINK_END, THINK_START
from nanoserve.frontend.chat.tool_parser import TOOL_CALL_END, TOOL_CALL_START
from nanoserve.sampling import SamplingParams
from nanoserve.structured_output import MAX_GRAMMAR_CHARS

# Qwen3's call, as its chat template writes one (the tool parser reads the JSON between the tags)
CALL_BEGIN = TOOL_CALL_START + '\n{"name": "{name}", "arguments": '
CALL_END = "}\n" + TOOL_CALL_END
CALL_SEPARATOR = "\n"  # between parallel calls, as the template writes them
THINK_SUFFIX = "\n\n"  # after </think>, as the template writes it
# Whitespace characters allowed in a row inside the arguments' JSON: `{"a": 1, "b": 2}` (the
# template's own spacing) and compact JSON pass, padding does not (a model could pad forever).
MAX_JSON_WHITESPACE = 1


@dataclass(frozen=True, slots=True)
class ForcedTools:
    """The calls a reply must make, (tool name, arguments schema) each, and how many:
    `exactly_one` (a named function, or "required" with parallel_tool_calls false: one call of any
    of them), else one or more (tool_choice "required": parallel calls allowed). `field` is the
    request field a constraint that does not compile is blamed on."""

    calls: list[tuple[str, dict[str, Any]]]
    exactly_one: bool
    field: str


def arguments_schema(parameters: dict[str, Any] | None, field: str) -> dict[str, Any]:
    """A tool's parameters as the schema of a call's "arguments": always an object (the tool
    parser takes no other value), so a schema without a type gets "type": "object"."""
    schema = dict(parameters or {})
    kind = schema.setdefault("type", "object")
    if kind != "object":
        raise InvalidArgument(
            f'a forced tool call needs an object schema ("type": "object"), got {kind!r}',
            field=field,
        )
    return schema


def _call(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": CALL_BEGIN.replace("{name}", name),  # a checked name: no JSON escapes needed
        "content": {
            "type": "json_schema",
            "json_schema": schema,
            "max_whitespace_cnt": MAX_JSON_WHITESPACE,
        },
        "end": CALL_END,
    }


def _think(state: ThinkState) -> dict[str, Any] | None:
    """The think block before the calls: free text up to </think>, then the template's blank
    line. Optional when the model may open one; none when the template closed it."""
    if state == "closed":
        return None
    block = {
        "type": "sequence",
        "elements": [
            {
                "type": "tag",
                "begin": THINK_START if state == "none" else "",
                # no <tool_call> in the reasoning: the parser would read it as a call
                "content": {"type": "any_text", "excludes": [TOOL_CALL_START]},
                "end": THINK_END,
            },
            {"type": "const_string", "value": THINK_SUFFIX},
        ],
    }
    return {"type": "optional", "content": block} if state == "none" else block


def structural_tag(forced: ForcedTools, think: ThinkState) -> str:
    """The structural tag (JSON text, xgrammar 0.2.9's format) of a reply that reasons (when the
    prompt lets it) and then makes its forced call(s), nothing else: the grammar is complete after
    a call, so the eos can end the reply only there."""
    calls = [_call(name, schema) for name, schema in forced.calls]
    body: dict[str, Any]
    if forced.exactly_one:  # one call: of the one tool, or one of the alternatives
        body = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
    else:
        body = {
            "type": "tags_with_separator",
            "tags": calls,
            "separator": CALL_SEPARATOR,
            "at_least_one": True,
        }
    prefix = _think(think)
    shape = body if prefix is None else {"type": "sequence", "elements": [prefix, body]}
    text = json.dumps({"type": "structural_tag", "format": shape}, ensure_ascii=False)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidArgument(
            f"the forced tools' schemas make a constraint of {len(text)} characters, more than "
            f"{MAX_GRAMMAR_CHARS}",
            field=forced.field,
        )
    return text


def constrained_params(
    params: SamplingParams, forced: ForcedTools, think: ThinkState
) -> SamplingParams:
    """The request's sampling params with the forced calls as their structured output."""
    return params.copy_with(
        {"structured_output": ("structural_tag", structural_tag(forced, think))}
    )
