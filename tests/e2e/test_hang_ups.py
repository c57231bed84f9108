"""Work a client walks away from is freed within a second (issue 33): a gRPC client process killed
with 20 streams open, an HTTP client process killed with 20 server-sent-event streams open, and one
SSE client that closes its connection. The worker must be idle (nothing running, every KV block
free) within 1 s of the hang-up, and the services keep serving."""

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from nanoserve.client import Client
from tests.e2e.gateway_process import base_url
from tests.e2e.processes import REPO_ROOT, Pair, Service, get_load, wait_idle

pytestmark = pytest.mark.e2e

STREAMS = 20
FREED_WITHIN_S = 1.0


def _hold(*args: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.stream_holder", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "open"
    return holder


def _freed_after_kill(holder: subprocess.Popen, worker_address: str) -> float:
    """SIGKILLs the client process; seconds until the worker is idle again."""
    assert get_load(worker_address).num_running == STREAMS
    killed = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    load = wait_idle(worker_address, timeout=10)
    freed = time.monotonic() - killed
    assert load.num_running == load.num_waiting == 0, load
    assert load.num_free_blocks == load.num_total_blocks, load
    return freed


def _still_serving(services: Pair) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        assert client.generate("Hello", max_tokens=4).usage.completion_tokens == 4


def test_a_killed_grpc_client_frees_its_streams_within_a_second(services: Pair) -> None:
    holder = _hold("grpc", services.frontend.address, str(STREAMS))
    assert _freed_after_kill(holder, services.worker.address) <= FREED_WITHIN_S
    _still_serving(services)


def test_a_killed_http_client_frees_its_event_streams_within_a_second(
    services: Pair, gateway: Service, model: str
) -> None:
    holder = _hold("http", base_url(gateway), model, str(STREAMS))
    assert _freed_after_kill(holder, services.worker.address) <= FREED_WITHIN_S
    _still_serving(services)


def test_an_sse_client_that_hangs_up_frees_its_request_within_a_second(
    services: Pair, gateway: Service, model: str
) -> None:
    body = {"model": model, "prompt": "Hi", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(
        base_url(gateway) + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")
        assert get_load(services.worker.address).num_running == 1
        hung_up = time.monotonic()
    load = wait_idle(services.worker.address, timeout=10)
    assert time.monotonic() - hung_up <= FREED_WITHIN_S
    assert load.num_running == 0 and load.num_free_blocks == load.num_total_blocks, load
    _still_serving(services)
