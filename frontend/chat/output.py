"""Shapes a Chat reply's stream: the servicer's text deltas go through the reasoning split and the
tool-call parser (each when the request asks for it) and come out as ChatResponse fields.

text -> ReasoningParser -> (reasoning_content, answer) -> ToolCallParser -> (text, tool_calls)
"""

from collections.abc import Callable, Sequence
from typing import Any, Literal

from nanoserve.frontend.chat.reasoning import (
    THINK_END,
    THINK_START,
    ReasoningDelta,
    ReasoningParser,
    ThinkGate,
)
from nanoserve.frontend.chat.tool_parser import ToolCallParser
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2

TURN_START = "<|im_start|>"  # Qwen3's; the generation prompt's turn opens with it


# What the rendered prompt says about the reply's think block: "open" (the template opened it: the
# reply reasons until </think>), "closed" (the template wrote an empty one: enable_thinking=false)
# or "none" (the model may open one itself, as Qwen3 does with thinking on).
ThinkState = Literal["open", "closed", "none"]


def think_in_prompt(prompt_ids: Sequence[int], token_id: Callable[[str], int | None]) -> ThinkState:
    """The think state of the prompt's last turn (after its last <|im_start|>): its last think tag
    decides (none: "none", as for a tokenizer without the tags). `token_id` maps a token's text to
    its id."""
    start, end, turn = token_id(THINK_START), token_id(THINK_END), token_id(TURN_START)
    for token in reversed(prompt_ids):
        if token == start:
            return "open"
        if token == end:
            return "closed"
        if token == turn:
            return "none"
    return "none"


class ChatOutput:
    """One Chat request's output shaping; with neither parser, fields pass through unchanged."""

    def __init__(
        self,
        reasoning: ReasoningParser | None = None,
        tools: ToolCallParser | None = None,
        think_open: bool = False,
    ) -> None:
        """`think_open`: the prompt opened the reply's think block (think_in_prompt "open")."""
        self.reasoning = reasoning
        self.tools = tools
        # the tool parser reads only the answer, whatever the output option: without the split,
        # the think block is passed on unchanged around it
        self.gate = ThinkGate(think_open) if tools is not None and reasoning is None else None

    def update(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Rewrites one response's fields (text, finish_reason) in place and adds reasoning_content,
        tool_calls and tool_call_parse_error; `finish_reason` marks the last message."""
        final = "finish_reason" in fields
        text = fields["text"]
        if self.reasoning is not None:
            split = _split(self.reasoning, text, final)
            fields["reasoning_content"] = split.reasoning
            text = split.content
        passed = ""  # the think block, unchanged (no reasoning split asked for)
        if self.gate is not None:
            gated = _split(self.gate, text, final)
            passed, text = gated.reasoning, gated.content
        if self.tools is not None:
            delta = self.tools.feed(text)
            if final:
                end = self.tools.finish()
                delta.text += end.text
                delta.tool_calls += end.tool_calls
                delta.parse_error = delta.parse_error or end.parse_error
            text = delta.text
            fields["tool_calls"] = [
                frontend_pb2.ToolCall(
                    id=call.id,
                    type="function",
                    function=frontend_pb2.ToolCallFunction(
                        name=call.name, arguments=call.arguments
                    ),
                )
                for call in delta.tool_calls
            ]
            fields["tool_call_parse_error"] = delta.parse_error
            if (
                final
                and fields["finish_reason"] == common_pb2.FINISH_REASON_STOP
                and self.tools.ends_with_tool_calls
            ):
                fields["finish_reason"] = common_pb2.FINISH_REASON_TOOL_CALLS
        fields["text"] = passed + text
        return fields


def _split(parser: ReasoningParser | ThinkGate, text: str, final: bool) -> ReasoningDelta:
    """`parser`'s split of one delta; on the reply's last, with what it still held."""
    split = parser.feed(text)
    if final:
        tail = parser.finish()
        split.reasoning += tail.reasoning
        split.content += tail.content
    return split
