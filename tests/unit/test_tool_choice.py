"""Forced tool choice (frontend.chat.tool_choice, chat_request): the request checks name the field; the
structural tag built for "required" and a named function compiles with xgrammar and, fed the real
Qwen tokenizer's ids, accepts well-formed Qwen3 calls (after a think block where the prompt allows
one) and refuses a wrong name, arguments off the schema, text around the calls, or no call; with
parallel_tool_calls false, "required" takes exactly one call of any tool."""

import json

import pytest

from nanoserve.errors import InvalidArgument
from nanoserve.frontend.admission import Limits
from nanoserve.frontend.chat.inputs import chat_inputs
from nanoserve.frontend.chat.tool_choice import ForcedTools, constrained_params, structural_tag
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as pb
from nanoserve.sampling import SamplingParams
from nanoserve.structured_output import MAX_GRAMMAR_CHARS

LIMITS = Limits(
    max_model_len=4096,
    vocab_size=151936,
    max_stop_strings=8,
    max_stop_string_length=64,
    max_prompt_bytes=1 << 20,
)
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = pb.Tool(
    function=pb.ToolFunction(name="get_weather", parameters=json.dumps(WEATHER_SCHEMA))
)
TIME = pb.Tool(function=pb.ToolFunction(name="get_time"))  # no parameters: any object
USER = [pb.ChatMessage(role="user", content="Weather in Paris?")]
EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>


def _request(**fields) -> pb.ChatRequest:
    return pb.ChatRequest(messages=USER, tools=[WEATHER, TIME], **fields)


def test_auto_and_none_force_nothing() -> None:
    for choice in ("", "auto", "none"):
        assert chat_inputs(_request(tool_choice=choice), LIMITS).forced is None


def test_required_and_named_function_pick_the_calls() -> None:
    required = chat_inputs(_request(tool_choice="required"), LIMITS)
    assert required.forced == ForcedTools(
        [("get_weather", WEATHER_SCHEMA), ("get_time", {"type": "object"})], False, "tools"
    )
    assert required.parse_tool_calls and required.tools is not None
    for choice in ("", "function"):
        named = chat_inputs(_request(tool_choice=choice, tool_choice_function="get_time"), LIMITS)
        assert named.forced == ForcedTools(
            [("get_time", {"type": "object"})], True, "tools[1].function.parameters"
        )


@pytest.mark.parametrize(
    "request_, field",
    [
        (pb.ChatRequest(messages=USER, tool_choice="required"), "tool_choice"),
        (pb.ChatRequest(messages=USER, tool_choice_function="get_weather"), "tool_choice"),
        (_request(tool_choice_function="get_wether"), "tool_choice_function"),
        (_request(tool_choice_function="bad name!"), "tool_choice_function"),
        (_request(tool_choice_function="x" * 1000), "tool_choice_function"),
        (_request(tool_choice="none", tool_choice_function="get_time"), "tool_choice_function"),
        (_request(tool_choice="required", tool_choice_function="get_time"), "tool_choice_function"),
        (_request(tool_choice="function"), "tool_choice_function"),
        (_request(tool_choice="anything"), "tool_choice"),
        (
            _request(
                tool_choice="required",
                sampling_params=common_pb2.SamplingParams(
                    structured_output=common_pb2.StructuredOutput(regex="a+")
                ),
            ),
            "sampling_params.structured_output",
        ),
        (
            pb.ChatRequest(
                messages=USER,
                tools=[pb.Tool(function=pb.ToolFunction(name="f", parameters='{"type": "array"}'))],
                tool_choice_function="f",
            ),
            "tools[0].function.parameters",
        ),
    ],
)
def test_bad_tool_choice_is_refused_naming_the_field(request_, field) -> None:
    with pytest.raises(InvalidArgument) as e:
        chat_inputs(request_, LIMITS)
    assert e.value.field == field


def test_the_tag_rides_in_a_copy_of_the_sampling_params() -> None:
    params = SamplingParams(temperature=0.5, max_tokens=9)
    forced = chat_inputs(_request(tool_choice="required"), LIMITS).forced
    assert forced is not None
    out = constrained_params(params, forced, "closed")
    assert params.structured_output is None
    assert out.temperature == 0.5 and out.max_tokens == 9 and out.unset == params.unset
    assert out.structured_output is not None
    kind, text = out.structured_output
    assert kind == "structural_tag" and json.loads(text)["type"] == "structural_tag"


def test_a_tag_past_the_bound_is_refused_naming_the_tools() -> None:
    big = {"type": "object", "description": "x" * MAX_GRAMMAR_CHARS}
    with pytest.raises(InvalidArgument) as e:
        structural_tag(ForcedTools([("f", big)], True, "tools[3].function.parameters"), "none")
    assert e.value.field == "tools[3].function.parameters"


# ---- the tag on xgrammar, at the token level of the real tokenizer ----------------------------


@pytest.fixture(scope="module")
def compile_tag(tokenizer_files_dir):
    pytest.importorskip("xgrammar")
    pytest.importorskip("torch")
    from nanoserve.worker.core.grammars import Grammars

    grammars = Grammars(str(tokenizer_files_dir), LIMITS.vocab_size, EOS)
    yield lambda text: grammars.compiled(("structural_tag", text)).result()
    grammars.close()


@pytest.fixture(scope="module")
def encode(tokenizer_files_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_files_dir / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _complete(compiled, ids: list[int]) -> bool:
    """Whether the grammar takes every id and then the eos (the output may end there)."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiled)
    return all(matcher.accept_token(i) for i in ids) and matcher.accept_token(EOS[0])


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


PARIS = _call("get_weather", '{"city": "Paris"}')
PARIS_F = _call("get_weather", '{"city":"Paris","unit":"f"}')  # compact JSON too
NOW = _call("get_time", '{"tz": "UTC", "n": [1, 2]}')


def _forced(choice: str, name: str = "", **fields) -> ForcedTools:
    request = _request(tool_choice=choice, tool_choice_function=name, **fields)
    forced = chat_inputs(request, LIMITS).forced
    assert forced is not None
    return forced


def test_named_function_takes_one_call_of_it(compile_tag, encode) -> None:
    compiled = compile_tag(structural_tag(_forced("", "get_weather"), "closed"))
    for good in (PARIS, PARIS_F):
        assert _complete(compiled, encode(good)), good
    for bad in (
        "",  # no call
        NOW,  # another tool
        _call("get_wether", '{"city": "Paris"}'),  # a wrong name
        _call("get_weather", '{"town": "Paris"}'),  # arguments off the schema
        _call("get_weather", '{"city": "Paris", "unit": "k"}'),
        _call("get_weather", '{"city": "Paris" }').replace('" }', '"  }'),  # padding
        _call("get_weather", '{"city": "Paris"'),  # unclosed
        PARIS + "\n" + PARIS,  # a second call
        PARIS + " done",  # text after it
        "Sure. " + PARIS,  # text before it
        "<think>\nhm\n</think>\n\n" + PARIS,  # thinking was turned off by the prompt
    ):
        assert not _complete(compiled, encode(bad)), bad


def test_required_takes_one_or_more_calls_of_any_tool(compile_tag, encode) -> None:
    compiled = compile_tag(structural_tag(_forced("required"), "closed"))
    for good in (PARIS, NOW, PARIS + "\n" + NOW + "\n" + PARIS_F):
        assert _complete(compiled, encode(good)), good
    for bad in ("", "Hello", PARIS + "\nHello", _call("nope", "{}"), _call("get_time", "[]")):
        assert not _complete(compiled, encode(bad)), bad


def test_required_without_parallel_calls_takes_exactly_one_call_of_any_tool(
    compile_tag, encode
) -> None:
    forced = _forced("required", parallel_tool_calls=False)
    assert forced.exactly_one and [name for name, _ in forced.calls] == ["get_weather", "get_time"]
    compiled = compile_tag(structural_tag(forced, "closed"))
    for good in (PARIS, PARIS_F, NOW):
        assert _complete(compiled, encode(good)), good
    for bad in (
        "",
        PARIS + "\n" + NOW,  # two calls, of either tool
        NOW + "\n" + PARIS,
        PARIS + "\n" + PARIS_F,
        PARIS + "\nHello",
        _call("get_weather", '{"town": "Paris"}'),
    ):
        assert not _complete(compiled, encode(bad)), bad
    thinking = compile_tag(structural_tag(forced, "none"))
    assert _complete(thinking, encode("<think>\nthe time, then.\n</think>\n\n" + NOW))
    assert not _complete(thinking, encode("<think>\nboth\n</think>\n\n" + NOW + "\n" + PARIS))


def test_parallel_tool_calls_true_or_unset_keeps_required_parallel() -> None:
    for fields in ({}, {"parallel_tool_calls": True}):
        inputs = chat_inputs(_request(tool_choice="required", **fields), LIMITS)
        assert inputs.forced is not None and not inputs.forced.exactly_one
        assert not inputs.single_call


def test_parallel_tool_calls_false_with_other_choices() -> None:
    """A named function is called once either way; "auto" is not constrained (the parser keeps
    one call); "none" has no tools to call: accepted, changes nothing."""
    named = chat_inputs(
        _request(tool_choice_function="get_time", parallel_tool_calls=False), LIMITS
    )
    assert named.forced == _forced("", "get_time") and named.single_call
    auto = chat_inputs(_request(tool_choice="auto", parallel_tool_calls=False), LIMITS)
    assert auto.forced is None and auto.parse_tool_calls and auto.single_call
    none = chat_inputs(_request(tool_choice="none", parallel_tool_calls=False), LIMITS)
    assert none.forced is None and not none.parse_tool_calls and none.tools is None


def test_thinking_comes_first_when_the_prompt_allows_it(compile_tag, encode) -> None:
    forced = _forced("", "get_weather")
    optional = compile_tag(structural_tag(forced, "none"))  # Qwen3: the model may open one
    assert _complete(optional, encode("<think>\nParis, so call it.\n</think>\n\n" + PARIS))
    assert _complete(optional, encode(PARIS))
    assert not _complete(optional, encode("<think>\nno call\n</think>\n\nIt is sunny."))
    assert not _complete(optional, encode("<think>\nnever closed " + PARIS))
    assert not _complete(optional, encode(f"<think>\n{PARIS}\n</think>\n\n{PARIS}"))
    opened = compile_tag(structural_tag(forced, "open"))  # the template opened it
    assert _complete(opened, encode("\nParis.\n</think>\n\n" + PARIS))
    assert not _complete(opened, encode(PARIS))


def test_the_parser_reads_what_the_tag_allows(compile_tag, encode) -> None:
    """The accepted text is what the tool parser turns into calls (one format on both sides)."""
    from nanoserve.frontend.chat.tool_parser import ToolCallParser

    text = PARIS + "\n" + NOW
    assert _complete(compile_tag(structural_tag(_forced("required"), "closed")), encode(text))
    parser = ToolCallParser()
    delta = parser.feed(text)
    end = parser.finish()
    calls = delta.tool_calls + end.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "UTC", "n": [1, 2]}),
    ]
    assert delta.text + end.text == "" and parser.ends_with_tool_calls
