"""Chat tools and the reasoning split through the real frontend and worker with the tiny model.
Random weights emit no tags, so this checks the plumbing: the tools and the tool-call history
reach the prompt exactly as transformers renders them (usage.prompt_tokens), and the new fields
flow back; the parsers are tested on recorded replies (tests/unit/test_chat_parsers.py)."""

import pytest

from nanoserve.client import Client
from nanoserve.errors import InvalidArgument
from tests.weather_tool import WEATHER

HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Call the tool.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_1"},
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _hf_prompt_tokens(hf_tokenizer, messages: list[dict], tools: list[dict] | None) -> int:
    # transformers renders arguments as given; the frontend parses them to an object (as vLLM
    # does) and the template writes them back with tojson: the same text for this JSON.
    text = hf_tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return len(hf_tokenizer(text, add_special_tokens=False).input_ids)


def test_tools_and_history_reach_the_prompt(services, hf_tokenizer) -> None:
    with Client(services.frontend.address, timeout=60) as client:
        with_tools = client.chat(HISTORY, tools=[WEATHER], temperature=0, max_tokens=4)
        without = client.chat(HISTORY, tools=[WEATHER], tool_choice="none", max_tokens=4)
        with pytest.raises(InvalidArgument, match="tools.0..function.parameters"):
            client.chat(HISTORY, tools=[{"function": {"name": "f", "parameters": "{"}}])
    assert with_tools.usage.prompt_tokens == _hf_prompt_tokens(hf_tokenizer, HISTORY, [WEATHER])
    assert without.usage.prompt_tokens == _hf_prompt_tokens(hf_tokenizer, HISTORY, None)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 50
    assert with_tools.finish_reason == "length" and with_tools.usage.completion_tokens == 4


def test_separate_reasoning_plumbing(services) -> None:
    """Random weights write no think tags: with the reasoning split on, an enable_thinking=false
    reply (the prompt's block is closed) is all text, unchanged (what the split holds back while
    it cannot tell, such as leading whitespace, comes later), and the fields are there."""
    messages = [{"role": "user", "content": "Say hi."}]
    with Client(services.frontend.address, timeout=60) as client:
        plain = client.chat(
            messages, temperature=0, max_tokens=12, enable_thinking=False, tools=[WEATHER]
        )
        chunks = list(
            client.chat_stream(
                messages,
                temperature=0,
                max_tokens=12,
                enable_thinking=False,
                separate_reasoning=True,
                tools=[WEATHER],
            )
        )
    assert "".join(c.text for c in chunks) == plain.text
    assert [t for c in chunks for t in c.token_ids] == plain.token_ids
    assert all(c.reasoning_content == "" for c in chunks)
    if "<tool_call>" not in plain.text:  # random weights: no block, so no call
        assert not any(c.tool_calls for c in chunks)
    assert chunks[-1].finish_reason == "length"
