"""frontend.workers.pool against fake workers (GetModelInfo and GetLoad only): link states, the pool's
serving flag, refusal of a worker with another model, and routing only to ready workers."""

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
import grpc.aio
import pytest

from nanoserve.frontend.workers.link import LinkState
from nanoserve.frontend.workers.pool import WorkerPool
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

DIGEST = "ab" * 32


class FakeWorker(worker_grpc.WorkerServiceServicer):
    def __init__(self, model_name: str = "m") -> None:
        self.info = worker_pb2.WorkerServiceGetModelInfoResponse(
            model_name=model_name,
            max_model_len=64,
            vocab_size=100,
            eos_token_ids=[1],
            kvcache_block_size=4,
            tokenizer_digest=DIGEST,
        )
        self.load = worker_pb2.GetLoadResponse(num_free_blocks=10, num_total_blocks=10)

    async def GetModelInfo(self, request, context):
        return self.info

    async def GetLoad(self, request, context):
        return self.load


async def serve(fake: FakeWorker) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    worker_grpc.add_WorkerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


def run(main: Callable) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


def test_draining_and_dead_workers_get_nothing_and_health_follows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="nanoserve.frontend")

    async def main() -> None:
        fakes = [FakeWorker(), FakeWorker()]
        servers = [await serve(f) for f in fakes]
        addresses = [a for _, a in servers]
        health: list[bool] = []

        async def on_serving(serving: bool) -> None:
            health.append(serving)

        pool = WorkerPool(",".join(addresses), DIGEST, on_serving, poll_interval_s=0.05)
        pool.start()
        try:
            await until(lambda: len(pool.links) == 2 and all(x.usable for x in pool.links.values()))
            await until(lambda: health == [True])  # told on a task of its own
            chosen = {pool.choose([n, n + 1, n + 2]).address for n in range(40)}
            assert chosen == set(addresses)  # distinct short prompts use both

            fakes[0].load.draining = True
            await until(lambda: pool.links[addresses[0]].state is LinkState.DRAINING)
            assert {pool.choose([n]).address for n in range(40)} == {addresses[1]}
            await servers[1][0].stop(0)
            await until(lambda: pool.links[addresses[1]].state is LinkState.UNREACHABLE)
            await until(lambda: health == [True, False])
            with pytest.raises(Exception, match="no worker takes requests"):
                pool.choose([1])
            fakes[0].load.draining = False
            await until(lambda: health == [True, False, True])
            assert pool.choose([1]).address == addresses[0]
        finally:
            await pool.close()
            for server, _ in servers:
                await server.stop(0)
        text = caplog.text
        assert text.count(f"worker at {addresses[0]} is draining") == 1
        assert text.count(f"worker at {addresses[1]} is unreachable") == 1
        assert text.count(f"worker at {addresses[0]} is back (was draining)") == 1

    run(main)


def test_a_worker_with_another_model_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        good, other = FakeWorker("m"), FakeWorker("another")
        (s1, a1), (s2, a2) = await serve(good), await serve(other)

        async def on_serving(serving: bool) -> None:
            pass

        pool = WorkerPool(a1, DIGEST, on_serving, poll_interval_s=0.05)
        pool.start()
        try:
            await until(lambda: pool.serving)  # a1 is the reference
            pool.targets.append(("127.0.0.1", int(a2.rsplit(":", 1)[1])))  # the set grows
            await pool._update({a1, a2})
            await until(lambda: pool.links[a2].state is LinkState.REFUSED)
            await asyncio.sleep(0.3)  # polled again: still refused, logged once
            assert pool.links[a2].state is LinkState.REFUSED
            assert {pool.choose([n]).address for n in range(20)} == {a1}
        finally:
            await pool.close()
            await s1.stop(0)
            await s2.stop(0)
        assert caplog.text.count(f"worker at {a2} refused: its model_name") == 1

    run(main)


def test_a_foreign_tokenizer_alone_is_failed_precondition() -> None:
    async def main() -> None:
        fake = FakeWorker()
        fake.info.tokenizer_digest = "cd" * 32
        server, address = await serve(fake)

        async def on_serving(serving: bool) -> None:
            pass

        pool = WorkerPool(address, DIGEST, on_serving, poll_interval_s=0.05)
        pool.start()
        try:
            await until(lambda: address in pool.links)
            await until(lambda: pool.links[address].state is LinkState.REFUSED)
            with pytest.raises(Exception, match="tokenizer") as exc:
                pool.model_info()
            assert type(exc.value).__name__ == "FailedPrecondition"
        finally:
            await pool.close()
            await server.stop(0)

    run(main)


def test_an_unresolvable_name_is_logged_once_and_added_when_it_resolves(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scaled service's name resolves to each replica; the set follows the answers."""
    answers: list[set[str] | None] = [None, None, set(), set()]

    async def main() -> None:
        fakes = [FakeWorker(), FakeWorker()]
        servers = [await serve(f) for f in fakes]
        addresses = {a for _, a in servers}
        answers[2] = {next(iter(sorted(addresses)))}
        answers[3] = addresses

        async def fake_resolve(host: str, port: int) -> set[str]:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if answer is None:
                raise OSError("Name or service not known")
            return answer

        monkeypatch.setattr("nanoserve.frontend.workers.pool.resolve", fake_resolve)

        async def on_serving(serving: bool) -> None:
            pass

        pool = WorkerPool("workers:50061", DIGEST, on_serving, resolve_interval_s=0.05)
        pool.start()
        try:
            await until(lambda: set(pool.links) == addresses)
            await until(lambda: all(link.usable for link in pool.links.values()))
        finally:
            await pool.close()
            for server, _ in servers:
                await server.stop(0)
        assert caplog.text.count("cannot resolve worker host workers") == 1

    run(main)


class SlowFirstAnswer(FakeWorker):
    """A worker whose first GetModelInfo answers after `delay_s` (one that is still coming up)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def GetModelInfo(self, request, context):
        await asyncio.sleep(self.delay_s)
        self.delay_s = 0.0
        return self.info


def test_a_call_to_a_fresh_pool_waits_for_its_connecting_worker_not_longer() -> None:
    """wait_serving: a pool whose worker has not answered yet waits for it (a call that reached a
    frontend process just started is served); one whose worker answered no (unreachable) returns
    at once, and the wait never outlasts its timeout."""

    async def main() -> None:
        async def on_serving(serving: bool) -> None:
            pass

        server, address = await serve(SlowFirstAnswer(0.3))
        pool = WorkerPool(address, DIGEST, on_serving, poll_interval_s=0.05)
        try:
            pool.start()
            assert not pool.serving
            started = time.monotonic()
            await pool.wait_serving(5.0)
            assert pool.serving and pool.model_info().model_name == "m"
            assert 0.2 < time.monotonic() - started < 3.0  # woken by the answer, not the timeout
        finally:
            await pool.close()
            await server.stop(0)

        slow, slow_address = await serve(SlowFirstAnswer(10.0))
        pool = WorkerPool(slow_address, DIGEST, on_serving, poll_interval_s=0.05)
        try:
            pool.start()
            started = time.monotonic()
            await pool.wait_serving(0.3)  # still connecting when the timeout ends it
            assert 0.25 < time.monotonic() - started < 2.0 and not pool.serving
            with pytest.raises(Exception, match="connecting"):
                pool.model_info()
        finally:
            await pool.close()
            await slow.stop(0)

        dead_server, dead = await serve(FakeWorker())
        await dead_server.stop(0)  # nothing listens there any more
        pool = WorkerPool(dead, DIGEST, on_serving, poll_interval_s=0.05)
        try:
            pool.start()
            await until(lambda: pool.links and pool.links[dead].state is LinkState.UNREACHABLE)
            started = time.monotonic()
            await pool.wait_serving(5.0)
            assert time.monotonic() - started < 0.1  # every worker answered: nothing to wait for
        finally:
            await pool.close()

    run(main)
