"""The Chat output parsers on recorded Qwen3 replies: frontend.chat.reasoning (<think> split),
frontend.chat.tool_parser (<tool_call> blocks; the first call only with parallel_tool_calls false) and
frontend.chat.output (both, as ChatResponse fields). Every reply is also fed split into chunks at
every position (hypothesis): the result must not depend on where the stream's deltas fell."""

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.frontend.chat.output import ChatOutput, think_in_prompt
from nanoserve.frontend.chat.reasoning import ReasoningParser
from nanoserve.frontend.chat.tool_parser import ToolCallParser
from nanoserve.proto.v1 import common_pb2

# ---------------------------------------------------------------- recorded replies

# (reply, open_in_prompt) -> (reasoning, content)
REASONING_CASES = {
    "think then answer": (
        ("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello! How can I help?", False),
        ("The user greets me.\nI greet back.", "Hello! How can I help?"),
    ),
    "thinking off (empty block in the prompt)": (
        ("Hello! How can I help?", False),
        ("", "Hello! How can I help?"),
    ),
    "cut by max_tokens inside the block": (
        ("<think>\nLet me count: 1, 2,", False),
        ("Let me count: 1, 2,", ""),
    ),
    "cut right at a partial closing tag": (
        ("<think>\nhmm</thi", False),
        ("hmm</thi", ""),
    ),
    "block opened by the prompt": (
        ("Plan: add them.\n</think>\n\n4", True),
        ("Plan: add them.", "4"),
    ),
    "opened by the prompt, cut": (("still thinking", True), ("still thinking", "")),
    "empty block": (("<think>\n\n</think>\n\nHi.", False), ("", "Hi.")),
    "tags in the answer stay": (
        ("<think>x</think>Use <think> tags.", False),
        ("x", "Use <think> tags."),
    ),
    "newlines inside the reasoning stay": (
        ("<think>\n\na\n\nb\n\n</think>\n\n\nc\nd\n", False),
        ("a\n\nb", "c\nd\n"),
    ),
    "leading whitespace before the block": (("\n<think>r</think>c", False), ("r", "c")),
    "only whitespace": (("\n\n", False), ("", "\n\n")),
    "a partial opening tag that is not one": (("<thin", False), ("", "<thin")),
}

CALL_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
# reply -> (text, [(name, arguments)], parse_error, ends_with_tool_calls)
TOOL_CASES = {
    "one call": (CALL_WEATHER, ("", [("get_weather", {"city": "Paris"})], False, True)),
    "text then calls": (
        f"Let me check.\n{CALL_WEATHER}\n{CALL_TIME}\n",
        ("Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {})], False, True),
    ),
    "no calls": ("Just text, <b>bold</b>.\n", ("Just text, <b>bold</b>.\n", [], False, False)),
    "malformed JSON stays as text": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
            [],
            True,
            False,
        ),
    ),
    "a good call then a bad one": (
        f"{CALL_TIME}\n<tool_call>\n[1, 2]\n</tool_call>",
        ("<tool_call>\n[1, 2]\n</tool_call>", [("get_time", {})], True, False),
    ),
    "no name": (
        '<tool_call>{"arguments": {}}</tool_call>',
        ('<tool_call>{"arguments": {}}</tool_call>', [], True, False),
    ),
    "arguments absent": ('<tool_call>{"name": "f"}</tool_call>', ("", [("f", {})], False, True)),
    "text after the call": (
        f"{CALL_TIME}\nDone, see above.",
        ("Done, see above.", [("get_time", {})], False, False),
    ),
    "unclosed block, complete JSON (a stop string took the end tag)": (
        '<tool_call>\n{"name": "f", "arguments": {"x": [1, "ü"]}}\n',
        ("", [("f", {"x": [1, "ü"]})], False, True),
    ),
    "unclosed block cut mid-JSON (max_tokens)": (
        'Sure.<tool_call>\n{"name": "f", "argu',
        ('Sure.<tool_call>\n{"name": "f", "argu', [], True, False),
    ),
    "a partial tag that is not one": ("a <tool_ca", ("a <tool_ca", [], False, False)),
    "nested tag text in the arguments": (
        '<tool_call>\n{"name": "echo", "arguments": {"s": "<tool_call>"}}\n</tool_call>',
        ("", [("echo", {"s": "<tool_call>"})], False, True),
    ),
}
# parallel_tool_calls false (ToolCallParser(single_call=True)): the first call only, as vLLM keeps;
# a later block that holds a call is dropped whole, one that holds none stays as text
SINGLE_CALL_CASES = {
    "one call": (CALL_WEATHER, ("", [("get_weather", {"city": "Paris"})], False, True)),
    "two calls: the first is kept": (
        f"Let me check.\n{CALL_WEATHER}\n{CALL_TIME}\n",
        ("Let me check.", [("get_weather", {"city": "Paris"})], False, True),
    ),
    "text between, the dropped call ends the reply": (
        f"{CALL_TIME}\nand also\n{CALL_WEATHER}",
        ("and also", [("get_time", {})], False, True),
    ),
    "text after the dropped call": (
        f"{CALL_TIME}\n{CALL_WEATHER}\n{CALL_TIME}\nDone.",
        ("Done.", [("get_time", {})], False, False),
    ),
    "a bad block is no call: the next one is the first": (
        f"<tool_call>\n[1]\n</tool_call>\n{CALL_TIME}\n{CALL_WEATHER}",
        ("<tool_call>\n[1]\n</tool_call>", [("get_time", {})], True, True),
    ),
    "a bad block after the call stays": (
        f"{CALL_TIME}\n<tool_call>\n[1, 2]\n</tool_call>",
        ("<tool_call>\n[1, 2]\n</tool_call>", [("get_time", {})], True, False),
    ),
    "an unclosed second call is dropped too": (
        f'{CALL_TIME}\n<tool_call>\n{{"name": "f", "arguments": {{}}}}\n',
        ("", [("get_time", {})], False, True),
    ),
    "no calls": ("Just text.\n", ("Just text.\n", [], False, False)),
}


def _chunks(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(points)]


def _split(text: str, open_in_prompt: bool, cuts: list[int]) -> tuple[str, str]:
    parser = ReasoningParser(open_in_prompt)
    reasoning = content = ""
    for chunk in _chunks(text, cuts):
        delta = parser.feed(chunk)
        reasoning, content = reasoning + delta.reasoning, content + delta.content
    tail = parser.finish()
    return reasoning + tail.reasoning, content + tail.content


def _calls(
    text: str, cuts: list[int], single_call: bool = False
) -> tuple[str, list[tuple[str, dict]], bool, bool]:
    ids = (f"call_{i}" for i in itertools.count())
    parser = ToolCallParser(lambda: next(ids), single_call=single_call)
    out, calls, error = "", [], False
    for delta in [*(parser.feed(c) for c in _chunks(text, cuts)), parser.finish()]:
        out += delta.text
        calls += delta.tool_calls
        error = error or delta.parse_error
    assert [c.id for c in calls] == [f"call_{i}" for i in range(len(calls))]
    parsed = [(c.name, json.loads(c.arguments)) for c in calls]
    return out, parsed, error, parser.ends_with_tool_calls


def test_reasoning_split_recorded_replies() -> None:
    for name, ((reply, open_in_prompt), expected) in REASONING_CASES.items():
        assert _split(reply, open_in_prompt, []) == expected, name


def test_tool_calls_recorded_replies() -> None:
    for name, (reply, expected) in TOOL_CASES.items():
        assert _calls(reply, []) == expected, name


def test_every_single_cut() -> None:
    """Each reply cut in two at every position (the exhaustive part of the property below)."""
    for (reply, open_in_prompt), expected in REASONING_CASES.values():
        for i in range(len(reply) + 1):
            assert _split(reply, open_in_prompt, [i]) == expected, (reply, i)
    for reply, expected in TOOL_CASES.values():
        for i in range(len(reply) + 1):
            assert _calls(reply, [i]) == expected, (reply, i)
    for reply, expected in SINGLE_CALL_CASES.values():
        for i in range(len(reply) + 1):
            assert _calls(reply, [i], single_call=True) == expected, (reply, i)


def test_single_call_recorded_replies() -> None:
    for name, (reply, expected) in SINGLE_CALL_CASES.items():
        assert _calls(reply, [], single_call=True) == expected, name


@st.composite
def _reply_and_cuts(draw, cases: dict) -> tuple[str, list[int]]:
    name = draw(st.sampled_from(sorted(cases)))
    reply = cases[name][0] if isinstance(cases[name][0], str) else cases[name][0][0]
    cuts = draw(st.lists(st.integers(0, len(reply)), max_size=len(reply)))
    return name, cuts


@settings(max_examples=300, deadline=None)
@given(_reply_and_cuts(REASONING_CASES))
def test_reasoning_split_any_chunking(case: tuple[str, list[int]]) -> None:
    name, cuts = case
    (reply, open_in_prompt), expected = REASONING_CASES[name]
    assert _split(reply, open_in_prompt, cuts) == expected


@settings(max_examples=300, deadline=None)
@given(_reply_and_cuts(TOOL_CASES))
def test_tool_calls_any_chunking(case: tuple[str, list[int]]) -> None:
    name, cuts = case
    reply, expected = TOOL_CASES[name]
    assert _calls(reply, cuts) == expected


@settings(max_examples=300, deadline=None)
@given(_reply_and_cuts(SINGLE_CALL_CASES))
def test_single_call_any_chunking(case: tuple[str, list[int]]) -> None:
    name, cuts = case
    reply, expected = SINGLE_CALL_CASES[name]
    assert _calls(reply, cuts, single_call=True) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='ab \n<>/thinkol_c{}"', max_size=60), st.lists(st.integers(0, 60)))
def test_plain_text_any_chunking(text: str, cuts: list[int]) -> None:
    """Whatever the text, chunking does not change either parser's result, and the tool parser
    loses nothing of a text without blocks."""
    cuts = [c for c in cuts if c <= len(text)]
    assert _split(text, False, cuts) == _split(text, False, [])
    assert _calls(text, cuts) == _calls(text, [])
    if "<tool_call>" not in text:
        assert _calls(text, cuts)[0] == text


# ---------------------------------------------------------------- both, as response fields


def _stream(output: ChatOutput, chunks: list[str]) -> list[dict]:
    fields = [{"text": c, "token_ids": [1]} for c in chunks]
    fields[-1]["finish_reason"] = common_pb2.FINISH_REASON_STOP
    return [output.update(f) for f in fields]


def test_chat_output_fields() -> None:
    reply = f"<think>\nneed weather\n</think>\n\nChecking.\n{CALL_WEATHER}"
    cut = len(reply) - 20  # the call's block spans the last two messages
    out = _stream(ChatOutput(ReasoningParser(), ToolCallParser()), [reply[:cut], reply[cut:]])
    assert "".join(f["reasoning_content"] for f in out) == "need weather"
    assert "".join(f["text"] for f in out) == "Checking."
    assert out[0]["tool_calls"] == [] and len(out[1]["tool_calls"]) == 1
    call = out[1]["tool_calls"][0]
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert out[1]["finish_reason"] == common_pb2.FINISH_REASON_TOOL_CALLS


def test_chat_output_off_is_unchanged() -> None:
    reply = f"<think>x</think>{CALL_WEATHER}"
    out = _stream(ChatOutput(), [reply[:5], reply[5:]])
    assert "".join(f["text"] for f in out) == reply
    assert all("reasoning_content" not in f and "tool_calls" not in f for f in out)
    assert out[-1]["finish_reason"] == common_pb2.FINISH_REASON_STOP


def test_chat_output_tools_without_reasoning_split() -> None:
    out = _stream(ChatOutput(tools=ToolCallParser()), ["<think>x</think>\n\nok"])
    assert out[0]["text"] == "<think>x</think>\n\nok" and out[0]["tool_calls"] == []
    assert out[0]["finish_reason"] == common_pb2.FINISH_REASON_STOP
    length = {"text": CALL_TIME, "token_ids": [1], "finish_reason": common_pb2.FINISH_REASON_LENGTH}
    assert ChatOutput(tools=ToolCallParser()).update(length)["finish_reason"] == (
        common_pb2.FINISH_REASON_LENGTH
    )


def test_chat_output_never_streams_a_second_call() -> None:
    """parallel_tool_calls false, streamed token by token (about): one call in all, in the message
    where its block closed; nothing of the dropped block in any message's text."""
    reply = f"<think>\nboth?\n</think>\n\nChecking.\n{CALL_WEATHER}\n{CALL_TIME}"
    chunks = [reply[i : i + 3] for i in range(0, len(reply), 3)]
    output = ChatOutput(ReasoningParser(), ToolCallParser(single_call=True))
    out = _stream(output, chunks)
    calls = [(i, call) for i, f in enumerate(out) for call in f["tool_calls"]]
    assert [call.function.name for _, call in calls] == ["get_weather"]
    assert calls[0][0] == (reply.index("</tool_call>") + len("</tool_call>") - 1) // 3
    assert "".join(f["text"] for f in out) == "Checking."
    assert out[-1]["finish_reason"] == common_pb2.FINISH_REASON_TOOL_CALLS


def test_think_in_prompt() -> None:
    ids = {"<think>": 1, "</think>": 2, "<|im_start|>": 3}
    assert think_in_prompt([3, 9, 3, 9, 1, 9], ids.get) == "open"  # the template opened it
    assert think_in_prompt([3, 9, 3, 9, 1, 9, 2, 9], ids.get) == "closed"  # enable_thinking=false
    assert think_in_prompt([3, 9, 3, 9], ids.get) == "none"  # Qwen3: the model opens it
    assert think_in_prompt([3, 1, 9, 3, 9], ids.get) == "none"  # <think> in an earlier turn
    assert think_in_prompt([3, 9], {}.get) == "none"  # a tokenizer without the tags
