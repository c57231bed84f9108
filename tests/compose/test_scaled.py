"""docker-compose.scaled.yml on the CPU, for real: the frontend serves from both worker replicas,
picks up a third added with `--scale worker=3` while it runs (it re-resolves the service name),
and the stack stops with every container at exit 0 and `down -v` leaves nothing."""

import re
import time

import pytest

from nanoserve import Client
from tests.compose.conftest import published_port
from tests.compose.stack import SCALED, Stack, leftovers, service_of

FINISHED = re.compile(
    r"^nanoserve:worker_requests_finished_total(?:\{[^}]*\})? (\S+)$", re.MULTILINE
)
SPREAD_TIMEOUT_S = 90  # every replica served within this; the frontend re-resolves every 5 s


@pytest.fixture(scope="module")
def scaled() -> Stack:
    stack = Stack(SCALED)
    stack.up()
    yield stack
    stack.down()


def finished_per_worker(stack: Stack) -> dict[str, float]:
    """Requests each running worker replica finished, from its own /metrics."""
    return {
        c["Name"]: sum(float(v) for v in FINISHED.findall(stack.metrics(c, 9091)))
        for c in stack.containers("worker")
        if c["State"]["Status"] == "running"
    }


def serve_until_every_worker_served(stack: Stack, workers: int) -> dict[str, float]:
    """Sends rounds of short requests with distinct prompts (each prompt's hash picks a worker)
    until all `workers` replicas have finished some, or fails after SPREAD_TIMEOUT_S."""
    address = f"127.0.0.1:{published_port('NANOSERVE_FRONTEND_PORT')}"
    deadline = time.monotonic() + SPREAD_TIMEOUT_S
    counts: dict[str, float] = {}
    with Client(address, timeout=60) as client:
        for round_ in range(1000):
            for i in range(6):
                out = client.generate(f"prompt {round_} {i}", max_tokens=2, ignore_eos=True)
                assert out.finish_reason == "length"
            counts = finished_per_worker(stack)
            if len(counts) == workers and all(counts.values()):
                return counts
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"not every one of {workers} workers served: {counts}")


def test_serves_from_every_replica_and_picks_up_a_third(scaled: Stack) -> None:
    workers = scaled.containers("worker")
    assert len(workers) == 2
    assert all(w["State"]["Health"]["Status"] == "healthy" for w in workers)
    assert len(serve_until_every_worker_served(scaled, 2)) == 2
    frontend = {c["Id"]: c["State"]["StartedAt"] for c in scaled.containers("frontend")}
    scaled.up("--scale", "worker=3", "--no-recreate")
    # the same frontend, never restarted: it finds the third worker by resolving `worker` again
    assert {c["Id"]: c["State"]["StartedAt"] for c in scaled.containers("frontend")} == frontend
    assert len(serve_until_every_worker_served(scaled, 3)) == 3


def test_stops_with_every_container_at_exit_0_and_leaves_nothing(scaled: Stack) -> None:
    scaled.stop()
    states = [
        (service_of(c), c["State"]["Status"], c["State"]["ExitCode"]) for c in scaled.containers()
    ]
    assert sorted({s for s, _, _ in states}) == ["frontend", "gateway", "worker", "worker-auth"]
    assert all(state[1:] == ("exited", 0) for state in states), states
    scaled.down()
    assert leftovers(scaled.project) == {"containers": [], "networks": [], "volumes": []}
