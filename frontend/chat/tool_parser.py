"""Parses Qwen3's `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` blocks out of a
Chat reply's text stream (the answer part, after the reasoning split) into structured tool calls.

Each call is returned once its block closes; a block whose JSON is not a call stays in the text,
flagged, as vLLM's hermes parser does. The frontend sends them as ChatResponse.tool_calls.

With `single_call` (ChatRequest.parallel_tool_calls false) only the reply's first call is
returned; a later block that holds a call is dropped whole, neither a call nor text, as vLLM keeps
the first call only. A block is held until it closes, so a dropped call is never streamed.
"""

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as a JSON string


@dataclass(slots=True)
class ToolCallDelta:
    text: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    parse_error: bool = False  # a block in `text` held no valid call


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a block's body, or None when it is not a call: a JSON object
    with a non-empty string "name" and an object "arguments" (absent: no arguments)."""
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict):
        return None
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolCallParser:
    """One request's tool-call parsing. The whitespace around blocks (the newlines the model
    writes between text and calls) is dropped, as the chat template writes it back; text outside
    blocks is otherwise passed through unchanged, so a reply without blocks is untouched."""

    def __init__(self, new_id: Callable[[], str] = new_call_id, single_call: bool = False) -> None:
        self._new_id = new_id
        self._single_call = single_call
        self._in_call = False
        self._held = ""  # outside a block: trailing whitespace and a partial tag; inside: the body
        self._space_before = ""  # whitespace dropped before the open block (back if it is bad)
        self.num_calls = 0  # returned; dropped ones (single_call) are not counted
        self._after_call = False  # nothing but whitespace since the last call

    @property
    def ends_with_tool_calls(self) -> bool:
        """The reply so far made calls and said nothing after the last one."""
        return self.num_calls > 0 and self._after_call

    def feed(self, text: str) -> ToolCallDelta:
        delta = ToolCallDelta()
        # A long block's body was already searched: look for the end tag only where it can be.
        searched = max(0, len(self._held) - len(TOOL_CALL_END) + 1) if self._in_call else 0
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._in_call:
                end = buffer.find(TOOL_CALL_END, searched)
                searched = 0
                if end < 0:
                    self._held = buffer
                    break
                self._close(buffer[:end], TOOL_CALL_END, delta)
                buffer = buffer[end + len(TOOL_CALL_END) :]
                continue
            start = buffer.find(TOOL_CALL_START)
            if start >= 0:
                before = buffer[:start]
                self._emit(before.rstrip(), delta)
                self._space_before = before[len(before.rstrip()) :]
                self._in_call = True
                buffer = buffer[start + len(TOOL_CALL_START) :]
                continue
            # Hold a partial <tool_call> and the whitespace before it: both go if a block opens.
            keep = len(buffer) - _partial_suffix(buffer, TOOL_CALL_START)
            keep = len(buffer[:keep].rstrip())
            self._emit(buffer[:keep], delta)
            self._held = buffer[keep:]
            break
        return delta

    def finish(self) -> ToolCallDelta:
        """The end of the reply: a block left open (max_tokens, a stop string) is a call if its
        JSON is complete; held whitespace after a call is dropped."""
        delta = ToolCallDelta()
        held, self._held = self._held, ""
        if self._in_call:
            self._close(held, "", delta)
        else:
            self._emit(held, delta)
        return delta

    def _emit(self, text: str, delta: ToolCallDelta) -> None:
        if self._after_call:  # the whitespace between calls, or after the last one
            text = text.lstrip()
        if text:
            delta.text += text
            self._after_call = False

    def _close(self, body: str, end_tag: str, delta: ToolCallDelta) -> None:
        self._in_call = False
        parsed = parse_call(body.strip())
        if parsed is None:  # left as the model wrote it, whitespace included
            self._emit(self._space_before + TOOL_CALL_START + body + end_tag, delta)
            delta.parse_error = True
        else:
            if not (self._single_call and self.num_calls):
                delta.tool_calls.append(ParsedToolCall(self._new_id(), *parsed))
                self.num_calls += 1
            # A dropped call counts as one for how the reply ends: ending with it is ending with a
            # call (finish_reason "tool_calls"), and the whitespace after it goes as after any.
            self._after_call = True
        self._space_before = ""
