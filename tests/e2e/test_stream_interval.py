"""A request's stream_interval end to end: the Python client's chunks carry N tokens after the first
with the same text as per-token streaming, and a gateway with --stream-interval N sends SSE events
of N tokens (a whole reply, batched as far as the frontend allows, equals the streamed text)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nanoserve import Client
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair, Service

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e
GREEDY = {"max_tokens": 13, "temperature": 0.0, "ignore_eos": True}


def assert_batched(sizes: list[int], interval: int, total: int) -> None:
    """The first chunk at once, then `interval` tokens a chunk; the last holds what was left."""
    assert sum(sizes) == total, sizes
    assert all(size >= interval for size in sizes[1:-1]), sizes
    assert len(sizes) <= 2 + (total - 1) // interval, sizes


def test_the_python_clients_stream_interval(services: Pair) -> None:
    with Client(services.frontend.address) as client:
        plain = list(client.generate_stream("The sea", **GREEDY))
        batched = list(client.generate_stream("The sea", stream_interval=4, **GREEDY))
        chat = list(client.chat_stream([("user", "Hi")], stream_interval=5, **GREEDY))
    assert "".join(c.text for c in batched) == "".join(c.text for c in plain)
    assert_batched([len(c.token_ids) for c in batched], 4, 13)
    assert_batched([len(c.token_ids) for c in chat], 5, 13)


@pytest.fixture(scope="module")
def batching_gateway(services: Pair) -> Iterator[Service]:
    gateway = start_gateway(services.frontend.address, "--stream-interval", "3")
    yield gateway
    assert gateway.stop() == 0, gateway.output()


def test_a_gateways_stream_interval_batches_its_events(batching_gateway: Service) -> None:
    sdk = openai.OpenAI(base_url=base_url(batching_gateway) + "/v1", api_key="-", max_retries=0)
    (model,) = sdk.models.list().data
    request = {"model": model.id, "prompt": "The sea", "logprobs": 0, "extra_body": GREEDY}
    events = [c for c in sdk.completions.create(stream=True, **request) if c.choices]
    sizes = [len(e.choices[0].logprobs.tokens) for e in events if e.choices[0].logprobs]
    assert_batched(sizes, 3, 13)
    whole = sdk.completions.create(**request)
    assert whole.choices[0].text == "".join(e.choices[0].text for e in events)
    assert len(whole.choices[0].logprobs.tokens) == 13
