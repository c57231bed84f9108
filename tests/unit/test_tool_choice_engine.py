"""Forced tool choice on the offline engine with the tiny random Qwen3 (real Qwen tokenizer and chat
template): the frontend's chat inputs and structural tag, the worker's grammar; whatever the random
weights pick, the reply is calls that the tool parser reads, of the forced name(s), with arguments
valid against the tool's schema, ended by the eos once the grammar is complete; one call only with
parallel_tool_calls false."""

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from nanoserve.frontend.admission import Limits
from nanoserve.frontend.chat.inputs import chat_inputs
from nanoserve.frontend.chat.output import think_in_prompt
from nanoserve.frontend.chat.tool_choice import structural_tag
from nanoserve.frontend.chat.tool_parser import ToolCallParser
from nanoserve.proto.v1 import frontend_service_pb2 as pb
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.worker import LLM, SamplingParams

LIMITS = Limits(
    max_model_len=4096,
    vocab_size=151936,
    max_stop_strings=8,
    max_stop_string_length=64,
    max_prompt_bytes=1 << 20,
)
# every instance short (bounded strings and arrays, no free properties): a random model ends
SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "search": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 6},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
            "exact": {"type": "boolean"},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
}
TOOLS = [
    pb.Tool(function=pb.ToolFunction(name=name, parameters=json.dumps(schema)))
    for name, schema in SCHEMAS.items()
]
SEEDS = range(8)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    tok = Tokenizer(tiny_model_dir)
    yield tok
    tok.close()


def _replies(llm, tokenizer, **choice) -> list[list[tuple[str, dict]]]:
    """One reply per seed to a Chat forcing `choice`, with thinking off (the template closes the
    think block), as the tool parser reads it: the (name, arguments) of each call."""
    request = pb.ChatRequest(
        messages=[pb.ChatMessage(role="user", content="Weather in Paris, then search.")],
        tools=TOOLS,
        **choice,
    )
    inputs = chat_inputs(request, LIMITS)
    assert inputs.forced is not None
    prompt = tokenizer.encode_chat(inputs.messages, enable_thinking=False, tools=inputs.tools)
    tag = structural_tag(inputs.forced, think_in_prompt(prompt, tokenizer.token_to_id))
    params = [
        SamplingParams(
            temperature=1.0, seed=seed, max_tokens=400, structured_output=("structural_tag", tag)
        )
        for seed in SEEDS
    ]
    replies = []
    for out in llm.generate([prompt] * len(params), params, use_tqdm=False):
        text = tokenizer.decode(out.token_ids)
        assert out.finish_reason == "stop", text  # the eos, allowed once a call is complete
        assert out.token_ids[-1] in llm.eos_token_ids
        parser = ToolCallParser()
        delta, end = parser.feed(text), parser.finish()
        assert delta.text + end.text == "" and not (delta.parse_error or end.parse_error), text
        assert parser.ends_with_tool_calls
        calls = delta.tool_calls + end.tool_calls
        replies.append([(call.name, json.loads(call.arguments)) for call in calls])
    return replies


def test_a_named_function_is_called_once_with_valid_arguments(llm, tokenizer) -> None:
    for calls in _replies(llm, tokenizer, tool_choice_function="search"):
        assert len(calls) == 1
        name, arguments = calls[0]
        assert name == "search"
        jsonschema.validate(arguments, SCHEMAS["search"])


def test_required_calls_any_of_the_tools(llm, tokenizer) -> None:
    names = set()
    for calls in _replies(llm, tokenizer, tool_choice="required"):
        assert calls  # at least one
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
            names.add(name)
    assert names == set(SCHEMAS)  # 8 random replies: both tools are called (not one forced)


def test_required_without_parallel_calls_makes_exactly_one_call(llm, tokenizer) -> None:
    names = set()
    for calls in _replies(llm, tokenizer, tool_choice="required", parallel_tool_calls=False):
        assert len(calls) == 1, calls  # the parser reads every block: the grammar allowed one
        name, arguments = calls[0]
        jsonschema.validate(arguments, SCHEMAS[name])
        names.add(name)
    assert names == set(SCHEMAS)  # one call, but of either tool
