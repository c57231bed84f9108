"""A worker short of KV blocks (16 blocks of 16 tokens, max_num_seqs 8) behind the real frontend:
queued and preempted requests still give the offline engine's greedy tokens, requests cancelled
while queued or running free their blocks, and a request that can never fit is refused up front.
"""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve.client import AsyncClient, Client
from nanoserve.errors import InvalidArgument
from tests.e2e.processes import Pair, assert_idle, get_load, start_pair

pytestmark = pytest.mark.e2e

NUM_BLOCKS = 16
MAX_TOKENS = 80
TEXTS = [f"Request {i}: tell me about {i * 7919 % 1000}" for i in range(16)]


@pytest.fixture(scope="module")
def small_services(tiny_model_dir: Path) -> Iterator[Pair]:
    pair = start_pair(
        tiny_model_dir, ("--num-kvcache-blocks", str(NUM_BLOCKS), "--max-num-seqs", "8")
    )
    yield pair
    pair.stop()


def test_preempted_and_queued_requests_stay_exact(small_services, reference) -> None:
    with Client(small_services.frontend.address, timeout=30) as client:
        prompts = [client.tokenize(t) for t in TEXTS]
        assert client.model_info().max_model_len == NUM_BLOCKS * 16  # lowered to what fits
    want = reference(prompts, temperature=0, max_tokens=MAX_TOKENS)

    async def one(client: AsyncClient, i: int) -> list[int] | None:
        request = client.generate(prompts[i], temperature=0, max_tokens=MAX_TOKENS)
        if i % 3:
            return (await request).token_ids
        try:  # cancelled while queued, prefilling, running or preempted
            await asyncio.wait_for(request, timeout=0.05 * i)
        except TimeoutError:
            return None
        return []

    async def main() -> list[list[int] | None]:
        async with AsyncClient(small_services.frontend.address, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(len(TEXTS))))

    preemptions = get_load(small_services.worker.address).num_preemptions
    results = asyncio.run(main())
    for i, got in enumerate(results):
        if i % 3:
            assert got == want[i], f"request {i}"
    assert get_load(small_services.worker.address).num_preemptions > preemptions
    assert_idle(small_services.worker.address, NUM_BLOCKS)


def test_request_that_cannot_fit_is_refused(small_services) -> None:
    with Client(small_services.frontend.address, timeout=30) as client:
        with pytest.raises(InvalidArgument, match="max_tokens"):
            client.generate("hello", max_tokens=NUM_BLOCKS * 16)
        with pytest.raises(InvalidArgument, match="prompt"):
            client.generate(list(range(1000, 1000 + NUM_BLOCKS * 16)))
        done = client.generate("hello", temperature=0)  # unset max_tokens: fill the context
    assert done.finish_reason == "length"
    assert done.usage.prompt_tokens + done.usage.completion_tokens == NUM_BLOCKS * 16
    assert_idle(small_services.worker.address, NUM_BLOCKS)
