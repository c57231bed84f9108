"""nanoserve.frontend.chat.inputs: ChatRequest -> chat template inputs. The prompt rendered with
tools, tool calls and tool results equals transformers' apply_chat_template on the tiny model's
(real Qwen3) template; every new field is bounded and a bad one is refused naming it."""

import json
from pathlib import Path

import pytest

from nanoserve.errors import InvalidArgument
from nanoserve.frontend.admission import Limits
from nanoserve.frontend.chat.inputs import (
    MAX_TOOL_CALLS_PER_MESSAGE,
    MAX_TOOL_SCHEMA_BYTES,
    MAX_TOOLS,
    chat_inputs,
)
from nanoserve.proto.v1 import frontend_service_pb2 as pb
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.tiny.tokenizer import CHAT_TEMPLATE

LIMITS = Limits(
    max_model_len=4096,
    vocab_size=151936,
    max_stop_strings=8,
    max_stop_string_length=64,
    max_prompt_bytes=1 << 20,
)
WEATHER = pb.Tool(
    type="function",
    function=pb.ToolFunction(
        name="get_weather",
        description="Current weather in a city.",
        parameters=json.dumps(
            {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "城市"}},
                "required": ["city"],
            }
        ),
    ),
)
TIME = pb.Tool(function=pb.ToolFunction(name="get_time"))  # no description, no parameters


def _call(call_id: str, name: str, arguments: dict) -> pb.ToolCall:
    return pb.ToolCall(
        id=call_id,
        type="function",
        function=pb.ToolCallFunction(name=name, arguments=json.dumps(arguments)),
    )


CONVERSATIONS = {
    "tools only": [pb.ChatMessage(role="user", content="Weather in Paris?")],
    "system and tools": [
        pb.ChatMessage(role="system", content="Be brief."),
        pb.ChatMessage(role="user", content="Weather in Paris?"),
    ],
    "tool calls and results": [
        pb.ChatMessage(role="system", content="Be brief."),
        pb.ChatMessage(role="user", content="Weather in Paris and Oslo, and the time?"),
        pb.ChatMessage(
            role="assistant",
            content="Let me look.",
            reasoning_content="Two cities, then the time.",
            tool_calls=[
                _call("call_1", "get_weather", {"city": "Paris"}),
                _call("call_2", "get_weather", {"city": "Oslo"}),
            ],
        ),
        pb.ChatMessage(role="tool", content='{"temp": 21}', tool_call_id="call_1"),
        pb.ChatMessage(role="tool", content='{"temp": 9}', tool_call_id="call_2", name="x"),
        pb.ChatMessage(role="assistant", tool_calls=[_call("call_3", "get_time", {})]),
        pb.ChatMessage(role="tool", content="12:00", tool_call_id="call_3"),
    ],
    "a finished turn before a new question": [
        pb.ChatMessage(role="user", content="Weather in Paris?"),
        pb.ChatMessage(role="assistant", tool_calls=[_call("c", "get_weather", {"city": "Paris"})]),
        pb.ChatMessage(role="tool", content="sunny", tool_call_id="c"),
        pb.ChatMessage(role="assistant", content="<think>\nok\n</think>\n\nIt is sunny."),
        pb.ChatMessage(role="user", content="Thanks!"),
    ],
}


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    tok = Tokenizer(tiny_model_dir)
    yield tok
    tok.close()


def test_tiny_model_ships_qwen3_template(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    for part in ("# Tools", "<tools>", "<tool_call>", "<tool_response>", "reasoning_content"):
        assert part in CHAT_TEMPLATE


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("thinking", [True, False])
def test_prompt_equals_transformers(name: str, thinking: bool, tokenizer, hf_tokenizer) -> None:
    request = pb.ChatRequest(messages=CONVERSATIONS[name], tools=[WEATHER, TIME])
    inputs = chat_inputs(request, LIMITS)
    assert inputs.parse_tool_calls and inputs.tools is not None
    ours = tokenizer.apply_chat_template(
        inputs.messages, enable_thinking=thinking, tools=inputs.tools
    )
    theirs = hf_tokenizer.apply_chat_template(
        inputs.messages,
        tools=inputs.tools,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    assert ours == theirs
    assert '{"type": "function", "function": {"name": "get_weather", ' in ours
    assert '"城市"' in ours  # tojson keeps non-ASCII, as transformers' does
    if name == "tool calls and results":
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in ours
        assert "<tool_response>\n12:00\n</tool_response>" in ours
    # the ids the frontend sends are the same text's
    assert (
        tokenizer.encode_chat(inputs.messages, thinking, inputs.tools)
        == hf_tokenizer(theirs, add_special_tokens=False).input_ids
    )


def test_tool_choice_none_and_no_tools() -> None:
    messages = CONVERSATIONS["tools only"]
    none = chat_inputs(
        pb.ChatRequest(messages=messages, tools=[WEATHER], tool_choice="none"), LIMITS
    )
    assert none.tools is None and not none.parse_tool_calls
    bare = chat_inputs(pb.ChatRequest(messages=messages, tool_choice="auto"), LIMITS)
    assert bare.tools is None and not bare.parse_tool_calls
    assert bare.messages == [{"role": "user", "content": "Weather in Paris?"}]


def _refused(request: pb.ChatRequest, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        chat_inputs(request, LIMITS)
    assert e.value.field == field, e.value


USER = [pb.ChatMessage(role="user", content="hi")]


def _tool(**function) -> pb.Tool:
    return pb.Tool(function=pb.ToolFunction(**function))


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ChatRequest(messages=USER, tool_choice="required"), "tool_choice"),
        (pb.ChatRequest(messages=USER, tool_choice="x" * 10_000), "tool_choice"),
        (pb.ChatRequest(messages=USER, tools=[TIME] * (MAX_TOOLS + 1)), "tools"),
        (pb.ChatRequest(messages=USER, tools=[pb.Tool(type="code")]), "tools[0].type"),
        (pb.ChatRequest(messages=USER, tools=[_tool()]), "tools[0].function.name"),
        (pb.ChatRequest(messages=USER, tools=[_tool(name="a b")]), "tools[0].function.name"),
        (pb.ChatRequest(messages=USER, tools=[_tool(name="a" * 65)]), "tools[0].function.name"),
        (
            pb.ChatRequest(messages=USER, tools=[TIME, _tool(name="f", parameters="{")]),
            "tools[1].function.parameters",
        ),
        (
            pb.ChatRequest(messages=USER, tools=[_tool(name="f", parameters="[1]")]),
            "tools[0].function.parameters",
        ),
        (
            pb.ChatRequest(messages=USER, tools=[_tool(name="f", parameters="[" * 100_000)]),
            "tools[0].function.parameters",
        ),
        (
            pb.ChatRequest(
                messages=USER,
                tools=[_tool(name="f", parameters='{"a": "' + "x" * MAX_TOOL_SCHEMA_BYTES + '"}')],
            ),
            "tools[0].function.parameters",
        ),
        (
            pb.ChatRequest(
                messages=USER,
                tools=[_tool(name="f", description="x" * (LIMITS.max_prompt_bytes + 1))],
            ),
            "tools[0].function.description",
        ),
        (
            pb.ChatRequest(
                messages=[pb.ChatMessage(role="user", tool_calls=[_call("a", "f", {})])]
            ),
            "messages[0].tool_calls",
        ),
        (
            pb.ChatRequest(messages=[pb.ChatMessage(role="user", tool_call_id="a")]),
            "messages[0].tool_call_id",
        ),
        (
            pb.ChatRequest(
                messages=[
                    *USER,
                    pb.ChatMessage(
                        role="assistant",
                        tool_calls=[_call("a", "f", {})] * (MAX_TOOL_CALLS_PER_MESSAGE + 1),
                    ),
                ]
            ),
            "messages[1].tool_calls",
        ),
        (
            pb.ChatRequest(
                messages=[
                    *USER,
                    pb.ChatMessage(
                        role="assistant",
                        tool_calls=[
                            pb.ToolCall(
                                id="a", function=pb.ToolCallFunction(name="f", arguments="1")
                            )
                        ],
                    ),
                ]
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            pb.ChatRequest(
                messages=[
                    *USER,
                    pb.ChatMessage(role="assistant", tool_calls=[_call("i" * 129, "f", {})]),
                ]
            ),
            "messages[1].tool_calls[0].id",
        ),
        (
            pb.ChatRequest(messages=[*USER, pb.ChatMessage(role="tool", name="bad name")]),
            "messages[1].name",
        ),
        (
            pb.ChatRequest(messages=[pb.ChatMessage(role="robot")], tools=[_tool()]),
            "messages[0].role",  # messages are checked (and counted) first
        ),
    ],
)
def test_bad_fields_are_refused(request_: pb.ChatRequest, field: str) -> None:
    _refused(request_, field)
