"""Priorities and n > 1 through the real frontend and worker (max_num_seqs 4): a high-priority request
behind a full batch and queue finishes first; n completions come back grouped by index (seeded:
distinct and reproducible; greedy: identical), usage counts the prompt once; a bad n is refused
naming the field; cancelling an n = 4 call frees every block."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nanoserve.client import AsyncClient, Client
from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.processes import Pair, assert_idle, start_pair

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path) -> Iterator[Pair]:
    pair = start_pair(tiny_model_dir, ("--max-num-seqs", "4"))
    yield pair
    pair.stop()


def test_high_priority_behind_a_full_queue_finishes_first(pair) -> None:
    finished: list[str] = []

    async def one(client: AsyncClient, name: str, priority: int, max_tokens: int) -> None:
        await client.generate(
            f"request {name}", max_tokens=max_tokens, ignore_eos=True, priority=priority
        )
        finished.append(name)

    async def main() -> None:
        async with AsyncClient(pair.frontend.address, timeout=120) as client:
            # 4 run (max_num_seqs 4), 4 wait, each for far longer than the urgent one needs
            queued = [asyncio.create_task(one(client, f"low{i}", 0, 1000)) for i in range(8)]
            await asyncio.sleep(0.5)
            await one(client, "urgent", -5, 8)
            for task in queued:  # cancelled: the worker frees their blocks
                task.cancel()
            await asyncio.gather(*queued, return_exceptions=True)

    asyncio.run(main())
    assert finished == ["urgent"]
    assert_idle(pair.worker.address)


def test_n_completions_grouped_by_index(pair) -> None:
    with Client(pair.frontend.address, timeout=60) as client:
        sampling = {"temperature": 1.0, "seed": 7, "max_tokens": 16, "ignore_eos": True, "n": 4}
        first = client.generate("Once upon a time", **sampling)
        again = client.generate("Once upon a time", **sampling)
        assert len(first.choices) == 4
        ids = [tuple(c.token_ids) for c in first.choices]
        assert len(set(ids)) == 4 and all(len(i) == 16 for i in ids)
        assert [tuple(c.token_ids) for c in again.choices] == ids
        assert [c.text for c in again.choices] == [c.text for c in first.choices]
        prompt_tokens = len(client.tokenize("Once upon a time"))
        assert first.usage.prompt_tokens == prompt_tokens
        assert first.usage.completion_tokens == 4 * 16
        chunks = list(client.generate_stream("Once upon a time", **sampling))
        assert sorted({c.index for c in chunks}) == [0, 1, 2, 3]
        assert [c for c in chunks if c.usage is not None] == [chunks[-1]]

        greedy = client.generate("The sky", temperature=0, max_tokens=12, n=2)
        single = client.generate("The sky", temperature=0, max_tokens=12)
        assert [c.token_ids for c in greedy.choices] == [single.token_ids] * 2
        # a stop string ends each completion on its own (here all alike: greedy)
        stop = single.text[len(single.text) // 2 :][:3]
        stopped = client.generate("The sky", temperature=0, max_tokens=12, n=2, stop=stop)
        cut = single.text[: single.text.index(stop)]
        assert [(c.text, c.matched_stop) for c in stopped.choices] == [(cut, stop)] * 2
        chat = client.chat([("user", "hi")], temperature=0, max_tokens=6, n=3)
        assert [c.text for c in chat.choices] == [chat.text] * 3
        for bad in (0, 17):
            with pytest.raises(InvalidArgument, match="sampling_params.n"):
                client.generate("x", n=bad)
    assert_idle(pair.worker.address)


def test_cancelling_an_n4_call_frees_all_blocks(pair) -> None:
    with Client(pair.frontend.address, timeout=60) as client:
        stream = client.generate_stream(
            "A long story", temperature=1.0, max_tokens=200, ignore_eos=True, n=4
        )
        seen = set()
        for chunk in stream:
            seen.add(chunk.index)
            if len(seen) == 4:
                break
        stream.close()  # the client cancels the call; the frontend aborts the worker request
    assert_idle(pair.worker.address)


def test_worker_generate_tokens_tags_each_completion(pair) -> None:
    """WorkerService.GenerateTokens with n = 3: every message names its completion, each ends once
    with its own usage, and the worker refuses n out of range naming the field."""
    with grpc.insecure_channel(pair.worker.address) as channel:
        stub = worker_grpc.WorkerServiceStub(channel)
        request = worker_pb2.GenerateTokensRequest(
            request_id="n3",
            prompt_token_ids=[5, 6, 7, 8, 9],
            sampling_params=common_pb2.SamplingParams(
                temperature=0.9, seed=11, max_tokens=5, ignore_eos=True, n=3
            ),
            priority=2,
        )
        ids: dict[int, list[int]] = {}
        ends = []
        for response in stub.GenerateTokens(request, timeout=60):
            ids.setdefault(response.index, []).extend(response.token_ids)
            if response.finish_reason:
                ends.append(response.index)
                assert response.usage.completion_tokens == 5
        assert sorted(ends) == [0, 1, 2] and all(len(v) == 5 for v in ids.values())
        request.sampling_params.n = 17
        with pytest.raises(grpc.RpcError) as e:
            list(stub.GenerateTokens(request, timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "n: must" in e.value.details()
    assert_idle(pair.worker.address)
