"""The gateway's n, logprobs, response_format, tools and priority end to end: the official `openai`
SDK against the gateway in front of the real frontend and worker (tiny model, CPU), compared with
the gRPC client's answers to the same requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve import Client
from tests.e2e.gateway_process import MESSAGES, SCHEMA, base_url, start_gateway
from tests.e2e.processes import Pair, start_pair
from tests.weather_tool import WEATHER

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.e2e

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def sdk(services: Pair) -> Iterator[openai.OpenAI]:
    gateway = start_gateway(services.frontend.address)
    yield openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)
    assert gateway.stop() == 0, gateway.output()


@pytest.fixture(scope="module")
def model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def test_n_with_a_seed_gives_n_choices_stable_on_rerun(sdk: openai.OpenAI, model: str) -> None:
    def texts() -> list[str]:
        reply = sdk.completions.create(
            model=model,
            prompt="The sea is",
            n=3,
            seed=11,
            temperature=1.0,
            max_tokens=8,
            extra_body={"ignore_eos": True},
        )
        assert [c.index for c in reply.choices] == [0, 1, 2]
        assert reply.usage.completion_tokens == 3 * 8  # summed over the choices
        return [c.text for c in reply.choices]

    first = texts()
    assert len(set(first)) > 1 and texts() == first
    chat = sdk.chat.completions.create(
        model=model, messages=MESSAGES, n=2, seed=5, max_tokens=6, extra_body=NO_THINKING
    )
    assert [c.index for c in chat.choices] == [0, 1]
    streamed: dict[int, str] = {}
    stream = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        n=2,
        seed=5,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_THINKING,
    )
    finishes = {}
    for chunk in stream:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert streamed == {c.index: c.message.content for c in chat.choices}
    assert set(finishes) == {0, 1} and chunk.usage.total_tokens == chat.usage.total_tokens


def test_completion_logprobs_match_the_grpc_clients(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.generate("The sea is", max_tokens=6, temperature=0, logprobs=2)
    reply = sdk.completions.create(
        model=model, prompt="The sea is", max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert expected.logprobs is not None
    assert logprobs.tokens == [e.text for e in expected.logprobs]
    assert logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs])
    for top, e in zip(logprobs.top_logprobs, expected.logprobs, strict=True):
        assert top == pytest.approx(
            {**{t.text: t.logprob for t in e.top_logprobs}, e.text: e.logprob}
        )
    assert logprobs.text_offset[0] == 0 and reply.choices[0].text == expected.text


def test_chat_logprobs_and_top_logprobs_match_the_grpc_clients(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.chat(
            MESSAGES, max_tokens=6, temperature=0, logprobs=3, enable_thinking=False
        )
    reply = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body=NO_THINKING,
    )
    content = reply.choices[0].logprobs.content
    assert expected.logprobs is not None and len(content) == len(expected.logprobs)
    for got, e in zip(content, expected.logprobs, strict=True):
        assert got.token == e.text and got.logprob == pytest.approx(e.logprob)
        assert got.bytes == list(e.text.encode())
        assert [t.token for t in got.top_logprobs] == [t.text for t in e.top_logprobs]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(
            [t.logprob for t in e.top_logprobs]
        )
    stream = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        stream=True,
        extra_body=NO_THINKING,
    )
    streamed = [t.token for c in stream if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]  # fmt: skip
    assert streamed == [e.text for e in expected.logprobs]


def test_response_format_json_schema_returns_valid_json(sdk: openai.OpenAI, model: str) -> None:
    for seed in range(2):
        reply = sdk.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            max_tokens=96,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            },
            extra_body=NO_THINKING,
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    reply = sdk.completions.create(
        model=model,
        prompt="A code:",
        max_tokens=16,
        temperature=1.0,
        extra_body={"guided_regex": "[ab]{3}-[0-9]{2}"},
    )
    assert len(reply.choices[0].text) == 6 and reply.choices[0].text[3] == "-"
    # vLLM's structural_tag response_format: xgrammar's structure, here a tag around a JSON value
    # (a finite one: the reply must end within max_tokens whatever the random weights pick)
    tag = {
        "type": "tag",
        "begin": "<answer>",
        "content": {"type": "json_schema", "json_schema": {"enum": ["yes", "no"]}},
        "end": "</answer>",
    }
    reply = sdk.completions.create(
        model=model,
        prompt="The answer:",
        max_tokens=24,
        temperature=1.0,
        seed=3,
        extra_body={"response_format": {"type": "structural_tag", "format": tag}},
    )
    text = reply.choices[0].text
    assert reply.choices[0].finish_reason == "stop", text
    assert text.startswith("<answer>") and text.endswith("</answer>"), text
    assert json.loads(text.removeprefix("<answer>").removesuffix("</answer>")) in ("yes", "no")


def test_tools_reach_the_prompt_as_the_grpc_chat_renders_them(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.chat(MESSAGES, tools=[WEATHER], max_tokens=4, temperature=0)
    without = sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    reply = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=4,
        temperature=0,
        extra_body={"priority": -1, "separate_reasoning": True},
    )
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    assert reply.usage.prompt_tokens > without.usage.prompt_tokens
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    with Client(services.frontend.address) as client:
        expected = client.chat(history, tools=[WEATHER], max_tokens=4, temperature=0)
    reply = sdk.chat.completions.create(
        model=model, messages=history, tools=[WEATHER], max_tokens=4, temperature=0
    )
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens


def test_prompt_logprobs_split_by_the_frontend_stream_in_the_first_event(
    tiny_model_dir: Path,
) -> None:
    """The frontend sends a long prompt's entries in several messages (--max-logprobs-per-message
    64); the gateway's stream still carries them all on one event, equal to the whole reply's."""
    pair = start_pair(tiny_model_dir, frontend_args=("--max-logprobs-per-message", "64"))
    try:
        gateway = start_gateway(pair.frontend.address)
    except BaseException:
        pair.stop()
        raise
    try:
        sdk = openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)
        model = sdk.models.list().data[0].id
        prompt = "The sea is wide and the sky is blue. " * 20  # ~200 tokens: 4 messages
        args = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1}
        extra = {"prompt_logprobs": 2}
        whole = sdk.completions.create(**args, extra_body=extra)
        events = list(sdk.completions.create(**args, extra_body=extra, stream=True))
        with Client(pair.frontend.address) as client:
            prompt_ids = client.tokenize(prompt)
    finally:
        assert gateway.stop() == 0, gateway.output()
        pair.stop()
    expected = whole.choices[0].model_extra["prompt_logprobs"]
    assert len(expected) == len(prompt_ids) > 3 * 64  # position 0's null, then one per token
    carrying = [e for e in events if e.choices and e.choices[0].model_extra.get("prompt_logprobs")]
    assert len(carrying) == 1
    assert carrying[0].choices[0].model_extra["prompt_logprobs"] == expected
    assert carrying[0].choices[0].text  # the first token's event
    streamed = "".join(e.choices[0].text for e in events if e.choices)
    assert streamed == whole.choices[0].text
    tokens = [
        t
        for e in events
        if e.choices and e.choices[0].logprobs
        for t in e.choices[0].logprobs.tokens
    ]
    assert tokens == whole.choices[0].logprobs.tokens


def test_return_token_ids_gives_the_grpc_clients_ids(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    """vLLM's return_token_ids: token_ids and prompt_token_ids equal the gRPC client's, whole and
    streamed (deltas joined), on /v1/completions and /v1/chat/completions."""
    ids = {"return_token_ids": True}
    with Client(services.frontend.address) as client:
        expected = client.generate("The sea is", max_tokens=6, temperature=0)
        prompt_ids = client.tokenize("The sea is")
        expected_chat = client.chat(
            MESSAGES, max_tokens=6, temperature=0, enable_thinking=False,
            return_prompt_token_ids=True,
        )  # fmt: skip
    reply = sdk.completions.create(
        model=model, prompt="The sea is", max_tokens=6, temperature=0, extra_body=ids
    )
    choice = reply.choices[0]
    assert choice.token_ids == expected.token_ids and choice.prompt_token_ids == prompt_ids
    events = list(
        sdk.completions.create(
            model=model, prompt="The sea is", max_tokens=6, temperature=0, stream=True,
            extra_body=ids,
        )
    )  # fmt: skip
    assert [i for e in events for i in e.choices[0].token_ids] == expected.token_ids
    assert events[0].choices[0].prompt_token_ids == prompt_ids
    assert expected_chat.prompt_token_ids
    chat = sdk.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0,
        extra_body={**ids, **NO_THINKING},
    )  # fmt: skip
    assert chat.prompt_token_ids == expected_chat.prompt_token_ids  # type: ignore[attr-defined]
    assert chat.choices[0].token_ids == expected_chat.token_ids  # type: ignore[attr-defined]
    chunks = list(
        sdk.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
            extra_body={**ids, **NO_THINKING},
        )
    )  # fmt: skip
    assert chunks[0].prompt_token_ids == expected_chat.prompt_token_ids  # type: ignore[attr-defined]
    streamed = [i for c in chunks for d in c.choices for i in (getattr(d, "token_ids", None) or [])]
    assert streamed == expected_chat.token_ids


def test_stop_reason_names_the_stop_token_and_is_null_at_the_length(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        ids = client.generate("The sea is", max_tokens=4, temperature=0, ignore_eos=True).token_ids
        eos = client.model_info().eos_token_ids
    stop_id = next(i for i in ids[1:] if i not in eos)  # an eos would have no stop_reason
    cut = sdk.completions.create(
        model=model, prompt="The sea is", max_tokens=4, temperature=0,
        extra_body={"stop_token_ids": [stop_id], "ignore_eos": True},
    )  # fmt: skip
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].stop_reason == stop_id  # type: ignore[attr-defined]
    events = list(
        sdk.completions.create(
            model=model, prompt="The sea is", max_tokens=4, temperature=0, stream=True,
            extra_body={"stop_token_ids": [stop_id], "ignore_eos": True},
        )
    )  # fmt: skip
    assert events[-1].choices[0].stop_reason == stop_id  # type: ignore[attr-defined]
    full = sdk.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True, **NO_THINKING},
    )  # fmt: skip
    assert full.choices[0].finish_reason == "length"
    assert full.choices[0].stop_reason is None  # type: ignore[attr-defined]
