"""The OpenAI-compatible gateway end to end: the official `openai` SDK (sync and async) against
`python -m nanoserve.frontend.gateway` in front of the real frontend and worker (tiny model, CPU):
models, completions and chat, streamed and whole, stop strings, /tokenize and /detokenize.
"""

from __future__ import annotations

import asyncio

import pytest

from nanoserve import Client
from tests.e2e.gateway_process import MESSAGES, base_url, request_json
from tests.e2e.processes import Pair, Service

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e


def test_models_lists_the_served_model(gateway: Service, model: str, services: Pair) -> None:
    with Client(services.frontend.address) as client:
        assert model == client.model_info().model_name
    status, body = request_json("GET", base_url(gateway) + "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [model]
    assert request_json("GET", base_url(gateway) + "/health") == (200, {"status": "SERVING"})


def test_sync_streams_completion_and_chat_with_usage(sdk: openai.OpenAI, model: str) -> None:
    stream = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].text == text and whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12

    chat = list(
        sdk.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
        )
    )
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 10
    assert chat[-2].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chat[:-1])


def test_async_streams_completion_and_chat_with_usage(gateway: Service, model: str) -> None:
    async def run() -> tuple[str, str, int, int]:
        client = openai.AsyncOpenAI(base_url=base_url(gateway) + "/v1", api_key="unused")
        try:
            texts, counts = [], []
            for stream in (
                await client.completions.create(
                    model=model,
                    prompt="Waves",
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                ),
                await client.chat.completions.create(
                    model=model,
                    messages=MESSAGES,
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                ),
            ):
                parts, usage = [], None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        parts.append(getattr(choice, "text", None) or choice.delta.content or "")
                texts.append("".join(parts))
                counts.append(usage.completion_tokens)
            return texts[0], texts[1], counts[0], counts[1]
        finally:
            await client.close()

    completion_text, chat_text, n_completion, n_chat = asyncio.run(run())
    assert (n_completion, n_chat) == (8, 8)
    assert completion_text and chat_text


def test_stop_strings_end_the_reply(sdk: openai.OpenAI, model: str) -> None:
    free = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    for stop_param in (stop, [stop, "\x00never"]):
        stopped = sdk.completions.create(
            model=model, prompt="The sea is", max_tokens=24, temperature=0, stop=stop_param
        )
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].text == text[: text.index(stop)]
    chunks = sdk.completions.create(
        model=model, prompt="The sea is", max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]


def test_chat_text_equals_the_grpc_chat_reply(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.chat(MESSAGES, max_tokens=20, temperature=0, enable_thinking=False)
    reply = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    streamed = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected.text


def test_tokenize_and_detokenize_routes(gateway: Service, services: Pair, model: str) -> None:
    """vLLM's /tokenize and /detokenize: the frontend's tokenizer, a wrong model is a 404, and a
    bad id a 400 naming `tokens`."""
    url = base_url(gateway)
    with Client(services.frontend.address, timeout=30) as client:
        ids, info = client.tokenize("Hello world"), client.model_info()
    status, body = request_json(
        "POST", url + "/tokenize", {"model": model, "prompt": "Hello world"}
    )
    assert status == 200 and body == {
        "tokens": ids,
        "count": len(ids),
        "max_model_len": info.max_model_len,
    }
    status, body = request_json("POST", url + "/detokenize", {"tokens": ids})
    assert status == 200 and body == {"prompt": "Hello world"}
    status, body = request_json("POST", url + "/detokenize", {"model": "other", "tokens": ids})
    assert status == 404 and body["error"]["param"] == "model"
    status, body = request_json("POST", url + "/detokenize", {"tokens": [1, info.vocab_size]})
    assert status == 400 and body["error"]["param"] == "tokens[1]", body
    status, body = request_json("POST", url + "/tokenize", {"prompt": "x", "extra": 1})
    assert status == 400 and body["error"]["param"] == "extra"
