"""Tensor parallelism through gRPC: a worker with --tensor-parallel-size 2 (CPU, gloo) gives the
size-1 worker's greedy tokens, and a rank killed mid-generation ends the stream with an error, the
worker with a non-zero exit, and the frontend's service with UNAVAILABLE; a SIGTERM to the worker's
whole process group (systemd stop, `timeout`, kill -- -PGID) drains it and exits 0.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanoserve.client import Client
from nanoserve.errors import Internal, ServiceError, Unavailable
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Pair,
    Service,
    check_health,
    child_pids,
    cmdline,
    descendant_pids,
    pid_running,
    start_pair,
    worker_argv,
)

pytestmark = pytest.mark.e2e

PROMPTS = ["The capital of France is", "你好世界🙂", "def fibonacci(n):"]


def is_spawned(pid: int) -> bool:
    line = cmdline(pid)
    return "multiprocessing" in line and "spawn_main" in line


def engine_core_pid(worker_pid: int) -> int:
    """The worker's one spawned child: the engine core process (it spawns the ranks)."""
    cores = [pid for pid in child_pids(worker_pid) if is_spawned(pid)]
    assert len(cores) == 1, [cmdline(p) for p in child_pids(worker_pid)]
    return cores[0]


@pytest.fixture(scope="module")
def tp_services(tiny_model_dir: Path) -> Iterator[Pair]:
    pair = start_pair(tiny_model_dir, ("--tensor-parallel-size", "2"))
    yield pair
    pair.stop()


def test_tp2_greedy_equals_tp1(tp_services, services) -> None:
    with (
        Client(tp_services.frontend.address, timeout=30) as tp2,
        Client(services.frontend.address, timeout=30) as tp1,
    ):
        assert tp2.model_info().tensor_parallel_size == 2
        assert tp1.model_info().tensor_parallel_size == 1
        for prompt in PROMPTS:
            want = tp1.generate(prompt, temperature=0, max_tokens=24)
            got = tp2.generate(prompt, temperature=0, max_tokens=24)
            assert got.token_ids == want.token_ids, prompt
            assert got.text == want.text


@dataclass
class RankKill:
    """What happened after one rank of the tp=2 worker was SIGKILLed mid-generation."""

    error: Exception | None  # how the stream in flight ended
    stream_end_s: float  # from the kill to the end of that stream
    exit_code: int | None  # the worker's, None when it still ran 10 s later
    later_request: Exception | None  # a request sent through the frontend afterwards
    frontend_health: str
    leftovers: list[str]  # command lines of the worker's descendants still running 5 s later


@pytest.fixture(scope="module")
def rank_kill(tp_services) -> RankKill:
    """Kills rank 1 (a spawned child of the engine core process, found in /proc) with a stream in
    flight."""
    worker = tp_services.worker
    core = engine_core_pid(worker.pid)
    ranks = [pid for pid in child_pids(core) if is_spawned(pid)]
    assert len(ranks) == 1, [cmdline(p) for p in child_pids(core)]
    descendants = descendant_pids(worker.pid)  # the rank and multiprocessing's resource tracker
    error = later = exit_code = None
    try:
        with Client(tp_services.frontend.address, timeout=30) as client:
            stream = client.generate_stream("Tell me a long story", max_tokens=3000)
            next(stream)
            os.kill(ranks[0], signal.SIGKILL)
            start = time.monotonic()
            try:
                for _ in stream:
                    pass
            except ServiceError as e:
                error = e
            stream_end_s = time.monotonic() - start
            with contextlib.suppress(subprocess.TimeoutExpired):
                exit_code = worker.wait(timeout=10)
            try:
                client.generate("hello", max_tokens=4)
            except ServiceError as e:
                later = e
        deadline = time.monotonic() + 5.0
        while any(pid_running(p) for p in descendants) and time.monotonic() < deadline:
            time.sleep(0.05)
        return RankKill(
            error,
            stream_end_s,
            exit_code,
            later,
            check_health(tp_services.frontend.address, FRONTEND_SERVICE),
            [cmdline(p) for p in descendants if pid_running(p)],
        )
    finally:  # a leftover of this worker would outlive the session: end it by its pid
        for pid in descendants:
            if pid_running(pid) and "multiprocessing" in cmdline(pid):
                os.kill(pid, signal.SIGKILL)


def test_killed_rank_ends_the_stream_with_an_error(rank_kill) -> None:
    assert isinstance(rank_kill.error, (Unavailable, Internal)), rank_kill.error
    assert rank_kill.stream_end_s < 10.0


def test_killed_rank_ends_the_worker_nonzero(rank_kill, tp_services) -> None:
    assert rank_kill.exit_code not in (None, 0), tp_services.worker.output()
    assert rank_kill.leftovers == []  # nor does any process it started outlive it


def test_killed_rank_makes_the_frontend_unavailable(rank_kill) -> None:
    assert isinstance(rank_kill.later_request, Unavailable), rank_kill.later_request
    assert rank_kill.frontend_health == "NOT_SERVING"


def test_killed_rank_is_named_in_the_stream_error(rank_kill) -> None:
    """The worker ends its streams with the cause, not just a dropped connection."""
    assert "tensor-parallel" in str(rank_kill.error)


def test_sigterm_to_the_process_group_drains_and_exits_0(tiny_model_dir: Path) -> None:
    """The ranks get the group's SIGTERM too: they ignore it, rank 0 drains, tells them to leave,
    and the worker exits 0 with no process left behind."""
    setsid = [
        sys.executable,
        "-c",  # the worker leads its own process group: killpg spares pytest
        "import os, sys; os.setsid(); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
    ]
    argv = worker_argv(tiny_model_dir, "--tensor-parallel-size", "2")
    worker = Service("worker", setsid + argv[1:])
    try:
        worker.wait_serving(WORKER_SERVICE)
        descendants = descendant_pids(worker.pid)
        ranks = descendant_pids(engine_core_pid(worker.pid))  # the engine core spawns them
        assert any(is_spawned(p) for p in ranks), [cmdline(p) for p in descendants]
        os.killpg(worker.pid, signal.SIGTERM)
        code = worker.wait(timeout=30)
        assert code == 0, worker.output()
        assert "died" not in worker.output(), worker.output()
        deadline = time.monotonic() + 5.0
        while any(pid_running(p) for p in descendants) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [cmdline(p) for p in descendants if pid_running(p)] == []
    finally:
        if worker.alive():
            worker.kill()
