"""Issue 32: a `<tool_call>` the model drafts inside `<think>` is no call, whatever the output
option. With separate_reasoning off (the default) the think block passes through unchanged in
`text`, and only the answer after it reaches the tool-call parser; a real call after </think> is
still one. The reply is fed in small deltas, splitting the tags as a stream can."""

import pytest

from nanoserve.frontend.chat.output import ChatOutput
from nanoserve.frontend.chat.reasoning import ReasoningParser, ThinkGate
from nanoserve.frontend.chat.tool_parser import ToolCallParser
from nanoserve.proto.v1 import common_pb2

DRAFT = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
THINKING = f"<think>\nMaybe {DRAFT} no.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def run(reply: str, separate: bool, think_open: bool = False, step: int = 3):
    out = ChatOutput(
        ReasoningParser(think_open) if separate else None, ToolCallParser(), think_open
    )
    text, reasoning, calls = "", "", []
    pieces = [reply[i : i + step] for i in range(0, len(reply), step)]
    for i, piece in enumerate(pieces):
        fields = {"text": piece}
        if i == len(pieces) - 1:
            fields["finish_reason"] = common_pb2.FINISH_REASON_STOP
        fields = out.update(fields)
        text += fields["text"]
        reasoning += fields.get("reasoning_content", "")
        calls += [(c.function.name, c.function.arguments) for c in fields["tool_calls"]]
    return text, reasoning, calls


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
@pytest.mark.parametrize("separate", [False, True])
def test_a_call_drafted_while_thinking_is_no_call(separate: bool, step: int) -> None:
    text, reasoning, calls = run(THINKING + "No tool needed.", separate, step=step)
    assert calls == []
    if separate:
        assert DRAFT in reasoning and text == "No tool needed."
    else:
        assert text == THINKING + "No tool needed."  # the model's output, unchanged


@pytest.mark.parametrize("step", [1, 5, 1000])
@pytest.mark.parametrize("separate", [False, True])
def test_a_call_after_the_think_block_is_still_one(separate: bool, step: int) -> None:
    text, _, calls = run(THINKING + CALL, separate, step=step)
    assert calls == [("get_weather", '{"city": "Paris"}')]
    assert DRAFT not in [c[0] for c in calls]
    if not separate:
        assert text.strip() == THINKING.strip()  # the block stays; the call left the text


def test_a_prompt_that_opened_the_block_gates_from_the_first_token() -> None:
    reply = f"Maybe {DRAFT}\n</think>\n\n{CALL}"
    text, _, calls = run(reply, separate=False, think_open=True)
    assert calls == [("get_weather", '{"city": "Paris"}')]
    assert text.startswith(f"Maybe {DRAFT}")


def test_the_gate_alone() -> None:
    gate = ThinkGate()
    first = gate.feed("  <thi")
    assert (first.reasoning, first.content) == ("", "")
    second = gate.feed("nk>a</th")
    third = gate.feed("ink>b")
    assert second.reasoning + third.reasoning == "  <think>a</think>" and third.content == "b"
    plain = ThinkGate()
    assert plain.feed("hello").content == "hello"
