"""Process lifecycle of the real services: SIGTERM drains (NOT_SERVING, the stream in flight finishes,
exit 0), a SIGKILLed worker makes the frontend answer UNAVAILABLE at once, and a worker restarted on
the same port is found again.
"""

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve.client import Client
from nanoserve.errors import Unavailable
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Pair,
    Service,
    assert_idle,
    check_health,
    frontend_argv,
    get_load,
    start_frontend,
    start_pair,
    start_worker,
    worker_argv,
)

pytestmark = pytest.mark.e2e

GRACE = ("--grace-period-s", "20")
LONG = 400  # tokens of a stream that is still running while a test signals a process (~2 s)


class Services:
    """The module's own pair; each test restarts what an earlier one stopped (same ports)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.pair: Pair = start_pair(model_dir, GRACE, GRACE)
        self.worker_port = self.pair.worker.port

    def ensure_running(self) -> Pair:
        if not self.pair.worker.alive():
            self.pair.worker = start_worker(self.model_dir, *GRACE, port=self.worker_port)
        if not self.pair.frontend.alive():
            self.pair.frontend = start_frontend(self.model_dir, self.pair.worker.address, *GRACE)
        with Client(self.pair.frontend.address) as client:
            client.wait_ready(timeout=30)
        return self.pair


@pytest.fixture(scope="module")
def lifecycle(tiny_model_dir: Path) -> Iterator[Services]:
    services = Services(tiny_model_dir)
    yield services
    services.pair.stop()


def wait_health(address: str, service: str, want: str, timeout: float = 5.0) -> list[str]:
    """Polls the health status until it is `want`; returns the statuses seen."""
    seen = [check_health(address, service)]
    deadline = time.monotonic() + timeout
    while seen[-1] != want and time.monotonic() < deadline:
        time.sleep(0.02)
        seen.append(check_health(address, service))
    return seen


def test_sigterm_frontend_drains_the_stream_in_flight(lifecycle) -> None:
    pair = lifecycle.ensure_running()
    with Client(pair.frontend.address, timeout=60) as client:
        stream = client.generate_stream("Tell me a story", temperature=0, max_tokens=LONG)
        chunks = [next(stream)]
        pair.frontend.signal(signal.SIGTERM)
        seen = wait_health(pair.frontend.address, FRONTEND_SERVICE, "NOT_SERVING")
        assert seen[-1] == "NOT_SERVING", seen
        with pytest.raises(Unavailable):  # new calls are refused
            client.generate("hello", max_tokens=4)
        chunks.extend(stream)
    assert chunks[-1].finish_reason == "length"
    assert sum(len(c.token_ids) for c in chunks) == LONG
    assert pair.frontend.wait(timeout=15) == 0, pair.frontend.output()
    assert "frontend stopped" in pair.frontend.output()
    assert_idle(pair.worker.address)


def test_sigterm_worker_drains_the_stream_in_flight(lifecycle) -> None:
    pair = lifecycle.ensure_running()
    with Client(pair.frontend.address, timeout=60) as client:
        stream = client.generate_stream("Tell me a story", temperature=0, max_tokens=LONG)
        chunks = [next(stream)]
        pair.worker.signal(signal.SIGTERM)
        seen = wait_health(pair.worker.address, WORKER_SERVICE, "NOT_SERVING")
        assert seen[-1] == "NOT_SERVING", seen
        with pytest.raises(Unavailable):  # the draining worker takes no new request
            client.generate("hello", max_tokens=4)
        chunks.extend(stream)
        assert chunks[-1].finish_reason == "length"
        assert sum(len(c.token_ids) for c in chunks) == LONG
        assert pair.worker.wait(timeout=15) == 0, pair.worker.output()
        # the frontend outlives its worker: not serving, and it says why
        seen = wait_health(pair.frontend.address, FRONTEND_SERVICE, "NOT_SERVING")
        assert seen[-1] == "NOT_SERVING", seen
        with pytest.raises(Unavailable):
            client.generate("hello", max_tokens=4)


def test_sigterm_worker_cuts_streams_after_the_grace_period(lifecycle) -> None:
    pair = lifecycle.ensure_running()
    assert pair.worker.stop() == 0  # nothing in flight: it exits at once
    pair.worker = start_worker(
        lifecycle.model_dir, "--grace-period-s", "0.5", port=lifecycle.worker_port
    )
    with Client(pair.frontend.address, timeout=30) as client:
        client.wait_ready(timeout=30)
        stream = client.generate_stream("Tell me a long story", max_tokens=3000)
        next(stream)
        pair.worker.signal(signal.SIGTERM)
        start = time.monotonic()
        with pytest.raises(Unavailable):
            for _ in stream:
                pass
        assert 0.4 < time.monotonic() - start < 5.0
    assert pair.worker.wait(timeout=15) == 0, pair.worker.output()
    assert "1 streams cut" in pair.worker.output()


def test_killed_worker_is_unavailable_at_once_and_found_again(lifecycle) -> None:
    pair = lifecycle.ensure_running()
    with Client(pair.frontend.address, timeout=30) as client:
        before = client.generate("Hello world", temperature=0, max_tokens=8)
        stream = client.generate_stream("Tell me a story", max_tokens=3000)
        next(stream)
        pair.worker.kill()  # SIGKILL, reaped
        start = time.monotonic()
        with pytest.raises(Unavailable):  # the stream in flight ends
            for _ in stream:
                pass
        assert time.monotonic() - start < 1.0
        for _ in range(3):  # new requests: UNAVAILABLE, each within a second
            start = time.monotonic()
            with pytest.raises(Unavailable):
                client.generate("Hello world", temperature=0, max_tokens=8)
            assert time.monotonic() - start < 1.0
        seen = wait_health(pair.frontend.address, FRONTEND_SERVICE, "NOT_SERVING")
        assert seen[-1] == "NOT_SERVING", seen

        pair.worker = start_worker(lifecycle.model_dir, *GRACE, port=lifecycle.worker_port)
        client.wait_ready(timeout=30)
        after = client.generate("Hello world", temperature=0, max_tokens=8)
    assert after.token_ids == before.token_ids
    assert_idle(pair.worker.address)


def test_killed_frontend_frees_the_workers_blocks(lifecycle) -> None:
    pair = lifecycle.ensure_running()
    with Client(pair.frontend.address, timeout=30) as client:
        streams = [client.generate_stream(f"Story {i}", max_tokens=3000) for i in range(4)]
        for stream in streams:
            next(stream)
        assert get_load(pair.worker.address).num_running == 4
        pair.frontend.kill()  # SIGKILL: its connection to the worker drops
    assert_idle(pair.worker.address)


@pytest.mark.parametrize("service", ["worker", "frontend"])
def test_a_port_in_use_is_refused(lifecycle, service) -> None:
    """A second server on a served port exits instead of sharing it (grpc's default SO_REUSEPORT
    would let the kernel split new connections between the two)."""
    pair = lifecycle.ensure_running()
    busy = pair.frontend.port  # served by the module's frontend
    argv = (
        worker_argv(lifecycle.model_dir, port=busy)
        if service == "worker"
        else frontend_argv(lifecycle.model_dir, pair.worker.address, port=busy)
    )
    second = Service(service, argv)
    try:
        with pytest.raises(RuntimeError, match="before listening"):
            second.wait_listening(timeout=30)
        assert second.process.returncode != 0
    finally:
        second.stop()
