"""Forced tool choice through the real frontend and worker (tiny random model, CPU): gRPC Chat with
tool_choice_function / "required" (one call with parallel_tool_calls false), and the gateway with
the official `openai` SDK's named tool_choice and "required" (parallel_tool_calls=False too), whole
and streamed. Random weights call the tool only because decoding is constrained:
the reply is parsed calls of the forced tool(s), arguments valid against the schema, finish reason
"tool_calls"; an unknown name or a schema the grammar engine refuses is an error naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from nanoserve.client import Client
from nanoserve.errors import InvalidArgument
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair, assert_idle

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")
pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
# every instance short: a random model's call ends well within max_tokens
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"tz": {"enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_SCHEMA}}
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
# thinking off: a random model that opened a think block would not close it within max_tokens
FORCED = {"enable_thinking": False, "temperature": 1.0, "max_tokens": 256}


def test_grpc_chat_forced_calls_and_refusals(services: Pair) -> None:
    with Client(services.frontend.address, timeout=120) as client:
        for seed in range(3):
            reply = client.chat(
                MESSAGES,
                tools=[WEATHER, TIME],
                tool_choice_function="get_weather",
                seed=seed,
                **FORCED,
            )
            assert reply.finish_reason == "tool_calls", reply.text
            assert reply.text == "" and not reply.tool_call_parse_error
            (call,) = reply.tool_calls
            assert call.name == "get_weather" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
        chunks = list(
            client.chat_stream(
                MESSAGES, tools=[WEATHER, TIME], tool_choice="required", seed=7, **FORCED
            )
        )
        calls = [call for chunk in chunks for call in chunk.tool_calls]
        assert calls and chunks[-1].finish_reason == "tool_calls"
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])

        for kwargs, field in (
            ({"tools": [WEATHER], "tool_choice_function": "get_time"}, "tool_choice_function"),
            ({"tool_choice": "required"}, "tool_choice"),
            (
                {"tools": [WEATHER], "tool_choice": "none", "tool_choice_function": "get_weather"},
                "tool_choice_function",
            ),
            (
                {
                    "tools": [WEATHER],
                    "tool_choice": "required",
                    "structured_output": {"regex": "a"},
                },
                "sampling_params.structured_output",
            ),
        ):
            with pytest.raises(InvalidArgument, match=rf"^{re.escape(field)}: "):
                client.chat(MESSAGES, max_tokens=8, enable_thinking=False, **kwargs)
        # passes the frontend's checks, but xgrammar knows no type "x": the worker refuses it and
        # the frontend names the tool's schema
        bad = {"type": "object", "properties": {"a": {"type": "x"}}}
        bad_schema = {"type": "function", "function": {"name": "f", "parameters": bad}}
        with pytest.raises(
            InvalidArgument, match=r'^tools\[1\]\.function\.parameters: does not compile: .*"x"'
        ):
            client.chat(
                MESSAGES, tools=[WEATHER, bad_schema], tool_choice_function="f", max_tokens=8
            )
    assert_idle(services.worker.address)


def test_grpc_chat_required_without_parallel_calls_makes_one_call(services: Pair) -> None:
    with Client(services.frontend.address, timeout=120) as client:
        single = {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}
        for seed in range(3):
            reply = client.chat(MESSAGES, seed=seed, **single, **FORCED)
            assert reply.finish_reason == "tool_calls", reply.text
            assert reply.text == "" and not reply.tool_call_parse_error
            (call,) = reply.tool_calls
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        chunks = list(client.chat_stream(MESSAGES, seed=7, **single, **FORCED))
        (call,) = [call for chunk in chunks for call in chunk.tool_calls]
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        assert chunks[-1].finish_reason == "tool_calls"
    assert_idle(services.worker.address)


@pytest.fixture(scope="module")
def sdk(services: Pair) -> Iterator[openai.OpenAI]:
    gateway = start_gateway(services.frontend.address)
    yield openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)
    assert gateway.stop() == 0, gateway.output()


@pytest.fixture(scope="module")
def model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


NAMED = {"type": "function", "function": {"name": "get_weather"}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def test_gateway_named_tool_choice_returns_tool_calls(sdk: openai.OpenAI, model: str) -> None:
    reply = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice=NAMED,
        temperature=1.0,
        seed=1,
        max_tokens=256,
        extra_body=NO_THINKING,
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)

    stream = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=1.0,
        seed=2,
        max_tokens=256,
        stream=True,
        extra_body=NO_THINKING,
    )
    events = list(stream)
    streamed = [c for e in events for c in e.choices[0].delta.tool_calls or ()]
    assert streamed and [c.index for c in streamed] == list(range(len(streamed)))
    for call in streamed:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert events[-1].choices[0].finish_reason == "tool_calls"


def test_gateway_required_without_parallel_calls(sdk: openai.OpenAI, model: str) -> None:
    """OpenAI's parallel_tool_calls=False with tool_choice "required": exactly one call."""
    common = {
        "model": model,
        "messages": MESSAGES,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "max_tokens": 256,
        "extra_body": NO_THINKING,
    }
    reply = sdk.chat.completions.create(seed=3, **common)
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])

    events = list(sdk.chat.completions.create(seed=7, stream=True, **common))
    (streamed,) = [c for e in events if e.choices for c in e.choices[0].delta.tool_calls or ()]
    assert streamed.index == 0
    jsonschema.validate(json.loads(streamed.function.arguments), SCHEMAS[streamed.function.name])
    assert events[-1].choices[0].finish_reason == "tool_calls"


def test_gateway_unknown_tool_name_is_a_400(sdk: openai.OpenAI, model: str) -> None:
    for tools in ([WEATHER], None):
        with pytest.raises(openai.BadRequestError) as raised:
            sdk.chat.completions.create(
                model=model,
                messages=MESSAGES,
                tool_choice={"type": "function", "function": {"name": "get_time"}},
                max_tokens=8,
                **({"tools": tools} if tools else {}),
            )
        assert raised.value.status_code == 400
        error = raised.value.body
        assert error["param"] == "tool_choice" and error["type"] == "invalid_request_error"
