"""Issue 32: cached_tokens is reported however a request ends. The worker sends the prompt's prefix-
cache hit with the first output, so a reply the frontend ends itself (a stop string matched: the
worker's own last message never comes) still says how many prompt tokens were cached, through
gRPC and through the OpenAI gateway."""

import pytest

from nanoserve.client import Client

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time " * 24  # ~100 tokens: several full KV blocks of 16


def test_a_stop_string_ended_reply_keeps_cached_tokens(services) -> None:
    with Client(services.frontend.address, timeout=60) as client:
        first = client.generate(PROMPT, temperature=0, max_tokens=24, ignore_eos=True)
        assert first.finish_reason == "length"
        cut = next(i for i in range(4, len(first.text)) if first.text[i].strip())
        stop = first.text[cut : cut + 2]  # matches a few tokens in (greedy: the same reply)
        again = client.generate(PROMPT, temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
        plain = client.generate(PROMPT, temperature=0, max_tokens=24, ignore_eos=True)
    assert again.finish_reason == "stop", again
    assert plain.usage.cached_tokens > 0  # the worker's figure on its own last message
    assert again.usage.cached_tokens == plain.usage.cached_tokens, (again.usage, plain.usage)
