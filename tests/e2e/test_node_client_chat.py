"""clients/node/generate.js --chat: the Python client's text, reasoning and tool calls for the same
request, a stand-in's reasoning and tool calls printed as JSON lines, and a forced tool call."""

import json

import pytest

from nanoserve.client import Client
from tests.e2e.node_client_process import (
    as_printed,
    compact,
    find_node,
    run_node,
    stand_in,
    universal_newlines,
)
from tests.weather_tool import WEATHER

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


def test_node_client_chat_matches_the_python_client(node, services, tmp_path) -> None:
    """--chat sends the prompt as one user message; with --separate-reasoning and --tools the
    text, reasoning (stderr) and tool calls (JSON lines) are the Python client's for the same
    greedy request (random weights write no tags: the tools reach the prompt, usage shows it)."""
    prompt = "Weather in Paris?"
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([WEATHER]))
    address = ("--address", services.frontend.address, "--max-tokens", "12")
    with Client(services.frontend.address, timeout=30) as client:
        plain = client.chat([("user", prompt)], temperature=0, max_tokens=12)
        n2 = client.chat([("user", prompt)], temperature=0, max_tokens=12, n=2, priority=1)
        tooled = client.chat(
            [("user", prompt)],
            temperature=0,
            max_tokens=12,
            separate_reasoning=True,
            tools=[WEATHER],
        )
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools are rendered
    chat = run_node(node, *address, "--chat", prompt)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == universal_newlines(plain.text + "\n")
    pair = run_node(node, *address, "--chat", "--n", "2", "--priority", "1", prompt)
    assert pair.returncode == 0, pair.stderr
    assert pair.stdout == as_printed(n2.choices)
    args = ("--chat", "--separate-reasoning", "--tools", str(tools_file), prompt)
    result = run_node(node, *address, *args)
    assert result.returncode == 0, result.stderr
    calls = "".join(compact(c.to_dict()) + "\n" for c in tooled.tool_calls)
    assert result.stdout == universal_newlines(tooled.text + "\n" + calls)
    assert result.stderr == universal_newlines(tooled.reasoning_content)
    no_chat = run_node(node, *address, "--tools", str(tools_file), prompt)
    assert no_chat.returncode == 2 and "need --chat" in no_chat.stderr


def test_node_client_prints_reasoning_and_tool_calls(node, tmp_path) -> None:
    """Against a stand-in FrontendService that replies as a Qwen3 with tools would (the tiny
    model's random weights never do): the request carries what the flags say, the reasoning
    goes to stderr, each completed tool call is one JSON line after the text."""
    from nanoserve.proto.v1 import common_pb2
    from nanoserve.proto.v1 import frontend_service_pb2 as pb
    from nanoserve.proto.v1 import frontend_service_pb2_grpc as pb_grpc

    received: list = []
    call = pb.ToolCall(
        id="call_0",
        type="function",
        function=pb.ToolCallFunction(name="get_weather", arguments='{"city": "Paris"}'),
    )

    class Frontend(pb_grpc.FrontendServiceServicer):
        def Chat(self, request, context):
            received.append(request)
            yield pb.ChatResponse(reasoning_content="The user wants ", index=1)
            yield pb.ChatResponse(reasoning_content="the weather.", index=0)
            yield pb.ChatResponse(text="Let me check.", index=0)
            yield pb.ChatResponse(text="Checking.", tool_calls=[call], index=1)
            yield pb.ChatResponse(finish_reason=common_pb2.FINISH_REASON_STOP, index=0)
            yield pb.ChatResponse(finish_reason=common_pb2.FINISH_REASON_STOP, index=1)

    tools_path = tmp_path / "tools.json"
    tools_path.write_text(json.dumps([WEATHER]))
    with stand_in(Frontend()) as address:
        result = run_node(
            node,
            "--address", address,
            "--chat", "--separate-reasoning", "--tools", str(tools_path),
            "--n", "2", "--priority", "-1", "--max-tokens", "9", "--stream-interval", "3",
            "Weather in Paris?",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[0] Let me check.\n[1] Checking.\n" + compact({"index": 1, **call_dict(call)}) + "\n"
    )
    assert result.stderr == "The user wants the weather."
    [request] = received
    assert [(m.role, m.content) for m in request.messages] == [("user", "Weather in Paris?")]
    assert request.separate_reasoning and request.priority == -1 and request.stream_interval == 3
    assert request.sampling_params.n == 2 and request.sampling_params.max_tokens == 9
    assert [t.function.name for t in request.tools] == ["get_weather"]
    assert json.loads(request.tools[0].function.parameters) == WEATHER["function"]["parameters"]


# every instance short: a random model's forced call ends well within max_tokens
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}},
    },
}


def test_node_client_forces_the_named_tool(node, services, tmp_path) -> None:
    """--tool-function NAME: the worker constrains the reply to one call of NAME whose arguments
    fit its schema (thinking off: a random model would not close a think block)."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([TIME, weather]))
    result = run_node(
        node, "--address", services.frontend.address, "--chat", "--no-thinking",
        "--tools", str(tools), "--tool-function", "get_weather",
        "--temperature", "1", "--seed", "3", "--max-tokens", "256", "Weather in Paris?",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text, *lines = result.stdout.splitlines()
    assert text == ""
    (call,) = [json.loads(line) for line in lines]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


def call_dict(call) -> dict:
    return {
        "id": call.id,
        "type": call.type,
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }
