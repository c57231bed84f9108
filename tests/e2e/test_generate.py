"""Generate and Chat through the real frontend and worker processes: greedy output equals the offline
engine's, streamed deltas add up, 64 concurrent streams (some cancelled) stay exact and leave every
KV block free, and a deadline ends a request DEADLINE_EXCEEDED.
"""

import asyncio
import json
import time

import pytest

from nanoserve.client import AsyncClient, Client
from nanoserve.errors import DeadlineExceeded
from nanoserve.worker import SamplingParams
from tests.e2e.processes import assert_idle

pytestmark = pytest.mark.e2e

PROMPTS = [
    "The capital of France is",
    "Hello world",
    "你好世界🙂",
    "def fibonacci(n):",
    "1 2 3 4",
]
MAX_TOKENS = 24


def expected_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_greedy_generate_equals_offline_engine(services, reference, tokenizer) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        prompts = [client.tokenize(p) for p in PROMPTS]
        want = reference(prompts, temperature=0, max_tokens=MAX_TOKENS)
        for text, prompt_ids, want_ids in zip(PROMPTS, prompts, want, strict=True):
            chunks = list(client.generate_stream(text, temperature=0, max_tokens=MAX_TOKENS))
            streamed_ids = [t for c in chunks for t in c.token_ids]
            assert streamed_ids == want_ids, text
            assert "".join(c.text for c in chunks) == expected_text(tokenizer, want_ids)
            assert all(c.finish_reason is None for c in chunks[:-1])
            last = chunks[-1]
            assert last.finish_reason == "length"
            assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
                len(prompt_ids),
                MAX_TOKENS,
            )
            if text not in PROMPTS[:2]:
                continue
            # the same prompt as token ids, and the joined (non-streaming) form
            joined = client.generate(prompt_ids, temperature=0, max_tokens=MAX_TOKENS)
            assert joined.token_ids == want_ids
            assert joined.text == expected_text(tokenizer, want_ids)
            # ids in, ids out: the same ids, no text
            ids_only = client.generate(
                prompt_ids, temperature=0, max_tokens=MAX_TOKENS, detokenize=False
            )
            assert ids_only.token_ids == want_ids and ids_only.text == ""
            assert ids_only.finish_reason == "length"


def test_client_with_several_connections_uses_each(services, reference) -> None:
    """Client(connections=3): calls dealt round-robin over three connections, each of which
    carried a call (READY), and every reply equals the offline engine's."""
    import grpc

    with Client(services.frontend.address, timeout=30, connections=3) as client:
        prompt = client.tokenize(PROMPTS[0])
        (want,) = reference([prompt], temperature=0, max_tokens=8)
        for _ in range(3):
            assert client.generate(prompt, temperature=0, max_tokens=8).token_ids == want
        deadline = time.monotonic() + 5  # a subscription's callback runs on a gRPC thread
        while client._states != [grpc.ChannelConnectivity.READY] * 3:
            assert time.monotonic() < deadline, client._states
            time.sleep(0.01)


def test_seeded_sampling_streams_valid_multibyte_text(services, offline_llm, tokenizer) -> None:
    """Seeded sampling over the random model draws tokens from the whole vocabulary: CJK, emoji,
    byte fragments. The stream equals the offline engine's, and every prefix of the streamed text
    is a prefix of the decode of all ids (no U+FFFD released early for a split character)."""
    with Client(services.frontend.address, timeout=30) as client:
        prompt = client.tokenize("你好世界🙂")
        seeds = range(3)
        params = [SamplingParams(temperature=1.0, seed=s, max_tokens=32) for s in seeds]
        wants = [
            o.token_ids for o in offline_llm.generate([prompt] * len(seeds), params, use_tqdm=False)
        ]
        non_ascii = 0
        for seed, want_ids in zip(seeds, wants, strict=True):
            chunks = list(client.generate_stream(prompt, temperature=1.0, seed=seed, max_tokens=32))
            ids = [t for c in chunks for t in c.token_ids]
            assert ids == want_ids, f"seed {seed}"
            full = expected_text(tokenizer, ids)
            streamed = ""
            for chunk in chunks:
                streamed += chunk.text
                assert full.startswith(streamed), (seed, streamed, full)
            assert streamed == full
            non_ascii += sum(ord(ch) > 0x7F for ch in full)
        assert non_ascii > 10  # the check above really saw multi-byte text


def render_chat(model_dir, messages: list[dict], enable_thinking: bool | None) -> str:
    """The model's chat template rendered here, independently of the frontend."""
    import jinja2

    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    template = jinja2.Environment().from_string(config["chat_template"])
    return template.render(messages=messages, add_generation_prompt=True, **extra)


def test_chat_template_and_enable_thinking(services, tiny_model_dir, tokenizer, reference) -> None:
    messages = [{"role": "user", "content": "Say hi in Chinese: 你好"}]
    replies = {}
    with Client(services.frontend.address, timeout=30) as client:
        for thinking in (None, True, False):
            replies[thinking] = client.chat(
                messages, temperature=0, max_tokens=8, enable_thinking=thinking
            )
    # the default is thinking on; off appends an empty think block to the generation prompt
    assert replies[None] == replies[True]
    assert replies[False].usage.prompt_tokens > replies[True].usage.prompt_tokens
    for thinking in (True, False):
        text = render_chat(tiny_model_dir, messages, thinking)
        prompt = tokenizer.encode(text, add_special_tokens=False).ids
        reply = replies[thinking]
        assert reply.usage.prompt_tokens == len(prompt)
        assert reply.token_ids == reference([prompt], temperature=0, max_tokens=8)[0]
        assert reply.text == expected_text(tokenizer, reply.token_ids)
        assert reply.finish_reason == "length"


def test_64_concurrent_streams_with_cancellations(services, reference) -> None:
    n, max_tokens = 64, 20
    texts = [f"Request {i}: tell me about {i * 7919 % 1000}" for i in range(n)]
    with Client(services.frontend.address, timeout=30) as client:
        prompts = [client.tokenize(t) for t in texts]
    want = reference(prompts, temperature=0, max_tokens=max_tokens)

    async def one(client: AsyncClient, i: int) -> list[int] | None:
        stream = client.generate_stream(texts[i], temperature=0, max_tokens=max_tokens)
        ids: list[int] = []
        try:
            async for chunk in stream:
                ids.extend(chunk.token_ids)
                if i % 10 == 0 and len(ids) >= 3:
                    return None  # cancelled mid-stream: aclose() cancels the call
            return ids
        finally:
            await stream.aclose()

    async def main() -> list[list[int] | None]:
        async with AsyncClient(services.frontend.address, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    results = asyncio.run(main())
    for i, (got, want_ids) in enumerate(zip(results, want, strict=True)):
        if i % 10 == 0:
            assert got is None
        else:
            assert got == want_ids, f"stream {i}"
    assert_idle(services.worker.address)


def test_deadline_exceeded_frees_the_worker(services) -> None:
    with Client(services.frontend.address) as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.generate("Tell me a long story", timeout=0.2, temperature=0, max_tokens=4000)
        assert time.monotonic() - start < 2.0
        assert_idle(services.worker.address)
        # the deadline also reaches the worker when the client's stream is read slowly
        with pytest.raises(DeadlineExceeded):
            for _ in client.generate_stream("Another long story", timeout=0.3, max_tokens=4000):
                time.sleep(0.05)
        assert_idle(services.worker.address)
