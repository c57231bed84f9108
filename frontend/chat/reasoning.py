"""Splits Qwen3's `<think>…</think>` reasoning from the answer in a Chat reply's text stream.

The frontend feeds it the detokenized deltas of one request (with ChatRequest.separate_reasoning)
and sends the two parts as ChatResponse.reasoning_content and text, as vLLM's reasoning_content.
"""

import enum
from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


class _State(enum.Enum):
    BEFORE = enum.auto()  # nothing attributed yet: does the reply open with <think>?
    REASONING = enum.auto()  # inside the think block
    CONTENT = enum.auto()  # the answer: after </think>, or the reply opened no block


@dataclass(slots=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (a tag split across
    deltas)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _opening(buffer: str) -> _State | None:
    """Before anything is attributed: REASONING when the reply opens a think block, CONTENT when
    it does not, None while it cannot tell yet (whitespace, or a partial <think>)."""
    body = buffer.lstrip()
    if body.startswith(THINK_START):
        return _State.REASONING
    if THINK_START.startswith(body):
        return None
    return _State.CONTENT


class ReasoningParser:
    """One request's reasoning split. The newlines the chat template writes around the block
    (`<think>\\n…\\n</think>\\n\\n`) are dropped, as the template drops them when it renders an
    assistant turn's reasoning_content back, so that reasoning and text hold only what was said.

    `open_in_prompt`: the prompt ends inside a think block (a template that opens it for the
    model), so the reply starts as reasoning with no opening tag. A prompt whose think block is
    already closed (enable_thinking=false) leaves a reply with no tags: all of it is content."""

    def __init__(self, open_in_prompt: bool = False) -> None:
        self._state = _State.REASONING if open_in_prompt else _State.BEFORE
        self._held = ""  # text not yet attributed: a partial tag, newlines that may precede one
        self._strip_newlines = open_in_prompt  # at the start of a block's reasoning or content

    def feed(self, text: str) -> ReasoningDelta:
        delta = ReasoningDelta()
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._state is _State.BEFORE:
                opened = _opening(buffer)
                if opened is None:  # whitespace or a partial tag: wait
                    self._held = buffer
                    return delta
                if opened is _State.REASONING:
                    buffer = buffer.lstrip()[len(THINK_START) :]
                    self._strip_newlines = True
                self._state = opened
            elif self._state is _State.REASONING:
                buffer = self._reasoning(buffer, delta)
            else:
                if self._strip_newlines:
                    buffer = buffer.lstrip("\n")
                    self._strip_newlines = not buffer
                delta.content += buffer
                buffer = ""
        return delta

    def _reasoning(self, buffer: str, delta: ReasoningDelta) -> str:
        """Attributes what it can of `buffer` to the reasoning; returns what follows </think>."""
        if self._strip_newlines:
            buffer = buffer.lstrip("\n")
            if not buffer:
                return ""
            self._strip_newlines = False
        end = buffer.find(THINK_END)
        if end >= 0:
            delta.reasoning += buffer[:end].rstrip("\n")
            self._state, self._strip_newlines = _State.CONTENT, True
            return buffer[end + len(THINK_END) :]
        # Hold a partial </think> and the newlines before it: both go if the tag completes.
        keep = len(buffer) - _partial_suffix(buffer, THINK_END)
        keep = len(buffer[:keep].rstrip("\n"))
        delta.reasoning += buffer[:keep]
        self._held = buffer[keep:]
        return ""

    def finish(self) -> ReasoningDelta:
        """What is held at the end of the reply: a reply cut inside its think block (max_tokens)
        is all reasoning; a reply of only whitespace stays content."""
        held, self._held = self._held, ""
        if self._state is _State.REASONING:
            return ReasoningDelta(reasoning=held)
        return ReasoningDelta(content=held)


class ThinkGate:
    """Without the reasoning split (separate_reasoning off) but with tool calls parsed: a reply's
    think block, tags and newlines as they came (`reasoning`, passed on unchanged in the text), and
    the answer after it (`content`), which alone the tool-call parser reads: a call the model drafts
    while thinking is no call (issue 32)."""

    def __init__(self, open_in_prompt: bool = False) -> None:
        self._state = _State.REASONING if open_in_prompt else _State.BEFORE
        self._held = ""

    def feed(self, text: str) -> ReasoningDelta:
        delta = ReasoningDelta()
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._state is _State.BEFORE:
                opened = _opening(buffer)
                if opened is None:  # whitespace or a partial tag: wait
                    self._held = buffer
                    return delta
                self._state = opened  # the tag goes out with the reasoning, unchanged
            elif self._state is _State.REASONING:
                end = buffer.find(THINK_END)
                if end < 0:
                    keep = len(buffer) - _partial_suffix(buffer, THINK_END)
                    delta.reasoning += buffer[:keep]
                    self._held = buffer[keep:]
                    return delta
                end += len(THINK_END)
                delta.reasoning += buffer[:end]
                buffer = buffer[end:]
                self._state = _State.CONTENT
            else:
                delta.content += buffer
                buffer = ""
        return delta

    def finish(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        if self._state is _State.REASONING:
            return ReasoningDelta(reasoning=held)
        return ReasoningDelta(content=held)
