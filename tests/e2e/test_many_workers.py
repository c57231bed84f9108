"""One frontend over three real workers (tiny model, CPU): a shared prefix stays on one worker (its
prefix-cache hits show it) while distinct prompts spread; a second frontend shares the workers and a
worker with other tokenizer files is refused; a killed worker ends only its own streams. And the
frontend's health follows its only worker through a drain and back.
"""

import json
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve.client import Client
from nanoserve.errors import Unavailable
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Service,
    check_health,
    get_load,
    start_frontend,
    start_pair,
    start_worker,
)

pytestmark = pytest.mark.e2e

PREFIX_TOKENS = 256  # the frontend's default route_prefix_tokens
DISTINCT = 90  # distinct prompts spread over 3 workers: 30 each expected
MIN_SHARE = 15  # each worker gets at least half its fair share (P(fail) < 1e-3 per worker)


class Workers:
    def __init__(self, model_dir: Path) -> None:
        self.workers: list[Service] = []
        try:
            for _ in range(3):
                self.workers.append(start_worker(model_dir, wait=False))
            for worker in self.workers:
                worker.wait_serving(WORKER_SERVICE)
            self.addresses = ",".join(w.address for w in self.workers)
            self.frontend = start_frontend(model_dir, self.addresses)
        except BaseException:
            self.stop()
            raise

    def loads(self) -> list[worker_pb2.GetLoadResponse]:
        return [get_load(w.address) for w in self.workers]

    def stop(self) -> None:
        if hasattr(self, "frontend"):
            self.frontend.stop()
        for worker in self.workers:
            worker.stop()


@pytest.fixture(scope="module")
def three(tiny_model_dir: Path) -> Iterator[Workers]:
    workers = Workers(tiny_model_dir)
    yield workers
    workers.stop()


def finished(before: list, after: list) -> list[int]:
    return [b.num_finished - a.num_finished for a, b in zip(before, after, strict=True)]


def test_shared_prefix_stays_on_one_worker_and_distinct_prompts_spread(three: Workers) -> None:
    rng = random.Random(17)
    system = [rng.randrange(1000, 30000) for _ in range(PREFIX_TOKENS + 32)]
    before = three.loads()
    with Client(three.frontend.address, timeout=60) as client:
        for i in range(8):
            tail = [rng.randrange(1000, 30000) for _ in range(8 + i)]
            client.generate(system + tail, temperature=0, max_tokens=2)
        after = three.loads()
        counts = finished(before, after)
        assert sorted(counts) == [0, 0, 8], counts  # all eight on one worker
        home = counts.index(8)
        hits = [b.prefix_cache_hits - a.prefix_cache_hits for a, b in zip(before, after)]
        # the 7 repeats each found the shared prefix's whole blocks (288 tokens = 18 blocks)
        assert hits[home] >= 7 * PREFIX_TOKENS, hits
        assert after[home].prefix_cache_queries > before[home].prefix_cache_queries

        before = after
        for i in range(DISTINCT):
            prompt = [rng.randrange(1000, 30000) for _ in range(24)]
            client.generate(prompt, temperature=0, max_tokens=1)
        counts = finished(before, three.loads())
    assert sum(counts) == DISTINCT
    assert min(counts) >= MIN_SHARE, counts


def test_a_second_frontend_shares_the_workers_and_a_foreign_tokenizer_is_refused(
    three: Workers, tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["model_max_length"] = 12345  # other bytes: another tokenizer digest
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    foreign = start_worker(other)
    try:
        frontend = start_frontend(tiny_model_dir, f"{three.addresses},{foreign.address}")
        try:
            # both frontends use the same request ids at once: unique at the workers all the same
            before = three.loads()
            errors: list[BaseException] = []

            def run(address: str) -> None:
                try:
                    with Client(address, timeout=60) as client:
                        for i in range(12):
                            text = client.generate(
                                f"Story {i}", request_id=f"r{i}", temperature=0, max_tokens=4
                            )
                            assert text.finish_reason == "length"
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    errors.append(e)

            threads = [
                threading.Thread(target=run, args=(a,))
                for a in (three.frontend.address, frontend.address)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert not errors, errors
            assert sum(finished(before, three.loads())) == 24
            assert get_load(foreign.address).num_finished == 0  # never used
            log = frontend.output(200)
            assert log.count(f"worker at {foreign.address} refused") == 1, log
            assert "tokenizer" in log
        finally:
            frontend.stop()
    finally:
        foreign.stop()


def test_a_killed_worker_ends_only_its_streams(three: Workers) -> None:
    """Last in the module: it kills one of the three workers. The streams on the other two keep
    streaming after the kill (each stops itself 20 chunks later: on a busy CPU a long
    stream takes minutes to finish), the killed worker's end UNAVAILABLE."""
    num_streams = 9
    results: list[str | None] = [None] * num_streams
    first_token = [threading.Event() for _ in range(num_streams)]
    killed = threading.Event()

    def stream(i: int) -> None:
        after_kill = 0
        with Client(three.frontend.address, timeout=300) as client:
            try:
                for _ in client.generate_stream(
                    f"Stream {i} about {i * 7919}", max_tokens=3000, ignore_eos=True
                ):
                    first_token[i].set()
                    after_kill += killed.is_set()
                    if after_kill == 20:  # more than the killed worker could have buffered
                        results[i] = "streaming"
                        break  # cancels the call
                else:
                    results[i] = "ended before the kill"
            except Unavailable:
                results[i] = "UNAVAILABLE"
            finally:
                first_token[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(num_streams)]
    for thread in threads:
        thread.start()
    for event in first_token:
        assert event.wait(60)
    running = [load.num_running for load in three.loads()]
    assert sum(running) == num_streams, running
    victim = running.index(max(running))
    mark = len(three.frontend.lines)
    three.workers[victim].kill()
    killed.set()
    killed_at = time.monotonic()
    gone = f"worker at {three.workers[victim].address} is unreachable"
    while gone not in "".join(three.frontend.lines[mark:]) and time.monotonic() - killed_at < 5:
        time.sleep(0.01)
    # the frontend knows within a second (its session to the worker broke): nothing new goes there
    assert time.monotonic() - killed_at < 1.0, three.frontend.output()

    # new requests right after the kill succeed on the other two
    with Client(three.frontend.address, timeout=60) as client:
        for i in range(6):
            assert client.generate(f"After {i}", max_tokens=2).finish_reason == "length"
    for thread in threads:
        thread.join(120)
    assert results.count("UNAVAILABLE") == running[victim], (results, running)
    assert results.count("streaming") == num_streams - running[victim], (results, running)
    log = "".join(three.frontend.lines[mark:])
    assert log.count(gone) == 1, log
    assert check_health(three.frontend.address, FRONTEND_SERVICE) == "SERVING"


def wait_health(address: str, want: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while (status := check_health(address, FRONTEND_SERVICE)) != want:
        if time.monotonic() > deadline:
            return status
        time.sleep(0.05)
    return status


def test_health_follows_the_only_worker_through_a_drain(tiny_model_dir: Path) -> None:
    pair = start_pair(tiny_model_dir, ("--grace-period-s", "60"))
    try:
        port = pair.worker.port
        with Client(pair.frontend.address, timeout=120) as client:
            stream = client.generate_stream("A long story", max_tokens=3000, ignore_eos=True)
            next(stream)
            mark = len(pair.frontend.lines)
            pair.worker.signal(signal.SIGTERM)  # it drains: the stream keeps running
            assert wait_health(pair.frontend.address, "NOT_SERVING") == "NOT_SERVING"
            assert next(stream).token_ids  # still streaming from the draining worker
            assert pair.worker.alive()
            with pytest.raises(Unavailable):
                client.generate("hello", max_tokens=2)
            stream.close()  # cancels: the drained worker exits
            assert pair.worker.wait(30) == 0
            pair.worker = start_worker(tiny_model_dir, port=port)
            assert wait_health(pair.frontend.address, "SERVING", 30) == "SERVING"
            assert client.generate("hello", max_tokens=2).finish_reason == "length"
        log = "".join(pair.frontend.lines[mark:])
        address = pair.worker.address
        assert log.count(f"worker at {address} is draining") == 1, log
        assert log.count(f"worker at {address} is unreachable") == 1, log
        assert log.count(f"worker at {address} is back") == 1, log
    finally:
        pair.stop()
