"""The worker's engine core runs in its own process: a SIGKILLed engine core ends every stream with
UNAVAILABLE, turns health NOT_SERVING and the worker's exit non-zero; SIGTERM to the whole process
group (worker, engine core, ranks) drains the stream in flight and exits 0.
"""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.errors import ServiceError, Unavailable
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Service,
    check_health,
    cmdline,
    descendant_pids,
    pid_running,
    start_frontend,
    worker_argv,
)
from tests.e2e.test_tensor_parallel import engine_core_pid

pytestmark = pytest.mark.e2e


def start_worker_in_own_group(model_dir: Path, *args: str) -> Service:
    """A worker leading its own process group (setsid), so that the test can signal the group."""
    worker = Service("worker", ["setsid", *worker_argv(model_dir, *args)])
    try:
        worker.wait_serving(WORKER_SERVICE)
    except BaseException:
        worker.kill()
        raise
    return worker


def end_leftovers(pids: list[int]) -> list[str]:
    """Waits briefly for the processes to go; kills (by pid) and names those still running."""
    deadline = time.monotonic() + 5.0
    while any(pid_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [cmdline(p) for p in pids if pid_running(p)]
    for pid in pids:
        if pid_running(pid) and "multiprocessing" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)
    return left


def test_killed_engine_core_ends_streams_unavailable_and_the_worker_nonzero(
    tiny_model_dir: Path,
) -> None:
    worker = start_worker_in_own_group(tiny_model_dir)
    frontend = start_frontend(tiny_model_dir, worker.address)
    core = engine_core_pid(worker.pid)
    descendants = descendant_pids(worker.pid)
    error = exit_code = later = None
    try:
        with (
            Client(frontend.address, timeout=30) as client,
            grpc.insecure_channel(worker.address) as channel,
        ):
            direct = worker_grpc.WorkerServiceStub(channel).GenerateTokens(
                worker_pb2.GenerateTokensRequest(
                    prompt_token_ids=[1, 2, 3],
                    sampling_params=common_pb2.SamplingParams(max_tokens=3000, ignore_eos=True),
                ),
                timeout=30,
            )
            next(direct)
            stream = client.generate_stream("Tell me a long story", max_tokens=3000)
            next(stream)
            os.kill(core, signal.SIGKILL)
            start = time.monotonic()
            try:
                for _ in stream:
                    pass
            except ServiceError as e:
                error = e
            stream_end_s = time.monotonic() - start
            with pytest.raises(grpc.RpcError) as direct_error:
                for _ in direct:
                    pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                exit_code = worker.wait(timeout=10)
            try:
                client.generate("hello", max_tokens=4)
            except ServiceError as e:
                later = e
            frontend_health = check_health(frontend.address, FRONTEND_SERVICE)
    finally:
        leftovers = end_leftovers(descendants)
        worker.kill()
        frontend.stop()
    assert isinstance(error, Unavailable), error
    assert "engine core process died" in str(error)
    assert stream_end_s < 10.0
    assert direct_error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert exit_code not in (None, 0), worker.output()
    assert isinstance(later, Unavailable), later
    assert frontend_health == "NOT_SERVING"
    assert leftovers == []


@pytest.mark.parametrize("tp", ["1", "2"])
def test_sigterm_to_the_process_group_drains_and_exits_0(tiny_model_dir: Path, tp: str) -> None:
    """The engine core and the ranks ignore SIGTERM: the worker drains, then tells them to leave."""
    worker = start_worker_in_own_group(
        tiny_model_dir, "--tensor-parallel-size", tp, "--grace-period-s", "20"
    )
    descendants = descendant_pids(worker.pid)
    try:
        with grpc.insecure_channel(worker.address) as channel:
            stream = worker_grpc.WorkerServiceStub(channel).GenerateTokens(
                worker_pb2.GenerateTokensRequest(
                    prompt_token_ids=[1, 2, 3],
                    sampling_params=common_pb2.SamplingParams(max_tokens=40, ignore_eos=True),
                ),
                timeout=60,
            )
            chunks = [next(stream)]
            os.killpg(worker.pid, signal.SIGTERM)
            chunks.extend(stream)
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert sum(len(c.token_ids) for c in chunks) == 40
        assert worker.wait(timeout=30) == 0, worker.output()
    finally:
        leftovers = end_leftovers(descendants)
        worker.kill()
    assert leftovers == []
