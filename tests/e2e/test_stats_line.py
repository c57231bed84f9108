"""The worker logs its periodic stats line while it has work (here every 0.2 s), and the progress
bar of weight loading stays out of a log that is no terminal."""

import re
import time

import grpc
import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.processes import start_worker

pytestmark = pytest.mark.e2e

STATS = re.compile(
    r"running \d+, waiting \d+, KV cache [\d.]+% used, prompt [\d.]+ tok/s, "
    r"generation [\d.]+ tok/s, prefix cache hit rate [\d.]+%, preemptions \d+"
)


def test_stats_line_appears_while_the_worker_has_work(tiny_model_dir) -> None:
    worker = start_worker(tiny_model_dir, "--stats-interval-s", "0.2")
    try:
        request = worker_pb2.GenerateTokensRequest(
            prompt_token_ids=[5, 6, 7],
            sampling_params=common_pb2.SamplingParams(temperature=0, max_tokens=200),
        )
        with grpc.insecure_channel(worker.address) as channel:
            stub = worker_grpc.WorkerServiceStub(channel)
            for _ in stub.GenerateTokens(request, timeout=60):
                pass
        deadline = time.monotonic() + 10  # the last window closes 0.2 s after the work ends
        while not any(STATS.search(line) for line in worker.lines):
            assert time.monotonic() < deadline, worker.output()
            time.sleep(0.1)
        assert "generation" in worker.output(200)
        assert "Loading weights" not in worker.output(200)  # stdout is a pipe: no bar
    finally:
        assert worker.stop() == 0, worker.output()
