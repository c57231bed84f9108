"""--engine-core-cpus: the engine core's step loop runs on the CPU named, alone among the worker's
threads (the gRPC process's and the core's own pipe threads keep off it), and the worker serves;
under `nanoserve serve` the frontends keep off it too."""

import os
import time
from pathlib import Path

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.processes import (
    cmdline,
    descendant_pids,
    pid_running,
    start_serve,
    start_worker,
)
from tests.e2e.test_tensor_parallel import engine_core_pid

pytestmark = pytest.mark.e2e


def allowed(pid: int, tid: int) -> set[int]:
    """A thread's CPUs (Cpus_allowed_list: 0-1,3)."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    spec = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in spec.split(":")[1].strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_step_loop_has_its_cpu_alone(tiny_model_dir: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    worker = start_worker(tiny_model_dir, "--engine-core-cpus", str(cpu))
    try:
        core = engine_core_pid(worker.pid)
        deadline = time.monotonic() + 10  # the core pins its loop right after it says ready
        while allowed(core, core) != {cpu}:
            assert time.monotonic() < deadline, (allowed(core, core), worker.output())
            time.sleep(0.05)
        assert "step loop runs on CPU" in worker.output()
        others = [(p, t) for p in (worker.pid, core) for t in threads(p) if t != core]
        assert len(others) > 3  # the gRPC process's threads, the core's pipe threads
        assert all(cpu not in allowed(p, t) for p, t in others), [
            (p, t, allowed(p, t)) for p, t in others
        ]
        request = worker_pb2.GenerateTokensRequest(
            prompt_token_ids=[5, 6, 7],
            sampling_params=common_pb2.SamplingParams(
                temperature=0, max_tokens=16, ignore_eos=True
            ),
        )
        with grpc.insecure_channel(worker.address) as channel:
            stub = worker_grpc.WorkerServiceStub(channel)
            tokens = sum(len(o.token_ids) for o in stub.GenerateTokens(request, timeout=60))
        assert tokens == 16
    finally:
        assert worker.stop() == 0, worker.output()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_serve_keeps_its_frontends_off_the_step_loops_cpu(tiny_model_dir: Path) -> None:
    """`nanoserve serve --engine-core-cpus N`: the frontends and the worker's other threads run
    elsewhere (serve keeps itself off N before it starts them), the step loop on N alone."""
    cpu = max(os.sched_getaffinity(0))
    serve = start_serve(tiny_model_dir, "--engine-core-cpus", str(cpu), "--frontend-processes", "2")
    children: list[int] = []
    try:
        address = serve.wait_listening()
        children = descendant_pids(serve.pid)
        with Client(address, timeout=30) as client:
            reply = client.generate("Hello", max_tokens=4, temperature=0)
            assert reply.usage.completion_tokens == 4
        worker = next(p for p in children if "nanoserve.worker" in cmdline(p))
        core = engine_core_pid(worker)
        assert allowed(core, core) == {cpu}
        frontends = [p for p in children if "nanoserve.frontend" in cmdline(p)]
        assert len(frontends) == 2
        others = [(p, t) for p in [serve.pid, *children] for t in threads(p) if t != core]
        assert all(cpu not in allowed(p, t) for p, t in others), [
            (cmdline(p)[:60], t, allowed(p, t)) for p, t in others if cpu in allowed(p, t)
        ]
        assert serve.stop(60) == 0, serve.output()
    finally:
        if serve.alive():
            serve.kill()
        for pid in children:
            if pid_running(pid) and "nanoserve" in cmdline(pid):
                os.kill(pid, 9)
