"""Issue 32: the worker's gRPC process and its engine core never block each other on their pipes, and
a stuck core is seen. The review's recipe: while a 3,000-token prefill with prompt_logprobs=20 runs
(a step frame of ~1 MB), a burst of twelve 3,000-token adds (an add frame of ~180 kB, past the pipe's
64 KiB) arrives; at 5806f92 both processes slept in pipe writes forever. And an engine core that is
frozen (SIGSTOP) turns health NOT_SERVING, then makes the worker exit non-zero.
"""

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.processes import WORKER_SERVICE, check_health, descendant_pids
from tests.e2e.test_engine_core import end_leftovers, start_worker_in_own_group
from tests.e2e.test_tensor_parallel import engine_core_pid

pytestmark = pytest.mark.e2e

PROMPT = 3000


def _request(rng: random.Random, **sampling) -> worker_pb2.GenerateTokensRequest:
    # ids past 65,535: 5 bytes each in msgpack, as most of Qwen3's vocabulary
    return worker_pb2.GenerateTokensRequest(
        prompt_token_ids=[rng.randrange(70_000, 150_000) for _ in range(PROMPT)],
        sampling_params=common_pb2.SamplingParams(max_tokens=2, ignore_eos=True, **sampling),
    )


async def _run(address: str) -> tuple[list[int], list[float]]:
    rng = random.Random(0)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_grpc.WorkerServiceStub(channel)

        async def one(request: worker_pb2.GenerateTokensRequest) -> int:
            tokens = 0
            async for out in stub.GenerateTokens(request, timeout=180):
                tokens += len(out.token_ids)
            return tokens

        load_s: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:  # GetLoad answers throughout (it shares the gRPC loop)
            while not done.is_set():
                t = time.monotonic()
                await stub.GetLoad(worker_pb2.GetLoadRequest(), timeout=20)
                load_s.append(time.monotonic() - t)
                await asyncio.sleep(0.2)

        prober = asyncio.create_task(probe())
        a = asyncio.create_task(one(_request(rng, prompt_logprobs=20)))
        await asyncio.sleep(0.3)  # A's prefill is under way in the core
        burst = [asyncio.create_task(one(_request(rng))) for _ in range(12)]
        tokens = await asyncio.wait_for(asyncio.gather(a, *burst), 240)
        done.set()
        await prober
        return tokens, load_s


def test_a_big_step_frame_meets_a_big_add_burst(tiny_model_dir: Path) -> None:
    worker = start_worker_in_own_group(
        tiny_model_dir, "--kvcache-block-size", "256", "--num-kvcache-blocks", "200"
    )
    descendants = descendant_pids(worker.pid)
    try:
        tokens, load_s = asyncio.run(_run(worker.address))
    finally:
        worker.stop()
        end_leftovers(descendants)
    assert tokens == [2] * 13
    assert load_s and max(load_s) < 10.0, load_s  # the event loop was never frozen for long


def test_a_frozen_engine_core_turns_health_not_serving_then_the_worker_exits_nonzero(
    tiny_model_dir: Path,
) -> None:
    worker = start_worker_in_own_group(tiny_model_dir, "--engine-stall-timeout-s", "6")
    descendants = descendant_pids(worker.pid)
    core = engine_core_pid(worker.pid)
    statuses: list[str] = []
    exit_code = None
    try:
        assert check_health(worker.address, WORKER_SERVICE) == "SERVING"
        os.kill(core, signal.SIGSTOP)  # alive, but neither steps nor heartbeats
        t = time.monotonic()
        while time.monotonic() - t < 12 and worker.process.poll() is None:
            with contextlib.suppress(grpc.RpcError):
                status = check_health(worker.address, WORKER_SERVICE)
                if not statuses or statuses[-1] != status:
                    statuses.append(status)
            time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            exit_code = worker.wait(timeout=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGKILL)
        worker.kill()
        end_leftovers(descendants)
    assert "NOT_SERVING" in statuses, statuses
    assert exit_code not in (None, 0), worker.output()


def test_a_frontend_routes_around_a_worker_whose_engine_core_is_stuck(tiny_model_dir: Path) -> None:
    """The stuck worker's load reports say draining once its health turns NOT_SERVING (half the
    stall bound), so the frontend sends new requests to the other worker instead of into an engine
    that makes no progress (until the stuck one exits at the whole bound)."""
    from nanoserve.client import Client
    from tests.e2e.processes import get_load, start_frontend, start_worker

    stuck = start_worker_in_own_group(tiny_model_dir, "--engine-stall-timeout-s", "8")
    descendants = descendant_pids(stuck.pid)
    core = engine_core_pid(stuck.pid)
    healthy = start_worker(tiny_model_dir)
    frontend = start_frontend(tiny_model_dir, f"{stuck.address},{healthy.address}")
    try:
        os.kill(core, signal.SIGSTOP)
        deadline = time.monotonic() + 7
        while get_load(stuck.address).draining is False:  # its report while stalled
            assert time.monotonic() < deadline, stuck.output()
            time.sleep(0.1)
        time.sleep(0.5)  # the report reaches the frontend on its Session (or its next poll)
        with Client(frontend.address, timeout=20) as client:
            for i in range(8):  # distinct prompts: none is pinned to the stuck worker's prefix
                assert client.generate(f"{i} Once upon", max_tokens=3).usage.completion_tokens == 3
        assert get_load(healthy.address).num_finished >= 8
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGKILL)
        frontend.stop()
        healthy.stop()
        stuck.kill()
        end_leftovers(descendants)
