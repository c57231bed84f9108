"""Several gateway processes on one port (--reuse-port): the kernel spreads connections over them,
each serves and logs its own; without the flag a second gateway on a held port says so, exit 1."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import Pair, Service

pytestmark = pytest.mark.e2e
CONNECTIONS = 32  # each on its own connection: all on one process by chance is 2^-31


def logged(gateways: list[Service], line: str, want: int, timeout: float = 10.0) -> list[int]:
    """How many times each gateway logged `line`, once `want` in all (or after `timeout`): a
    request's log line comes just after its response."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [g.output(last=10_000).count(line) for g in gateways]
        if sum(counts) >= want or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def test_two_gateways_share_a_port_with_reuse_port(services: Pair) -> None:
    first = start_gateway(services.frontend.address, "--reuse-port")
    second: Service | None = None
    try:
        second = start_gateway(services.frontend.address, "--reuse-port", "--port", str(first.port))
        assert second.port == first.port
        for _ in range(CONNECTIONS):
            with urllib.request.urlopen(base_url(first) + "/v1/models", timeout=30) as response:
                assert response.status == 200
        counts = logged([first, second], "GET /v1/models 200", CONNECTIONS)
        assert sum(counts) == CONNECTIONS, counts
        assert all(counts), f"the kernel gave every connection to one gateway: {counts}"
    finally:
        assert first.stop() == 0, first.output()
        if second is not None:
            assert second.stop() == 0, second.output()


def test_a_second_gateway_without_reuse_port_says_the_port_is_busy(services: Pair) -> None:
    first = start_gateway(services.frontend.address)
    try:
        with pytest.raises(RuntimeError, match="exited with 1") as raised:
            start_gateway(services.frontend.address, "--port", str(first.port))
        assert "in use" in str(raised.value)
    finally:
        assert first.stop() == 0, first.output()


def test_the_gateway_is_healthy_once_every_frontend_connection_is_up(tiny_model_dir) -> None:
    """Started before its frontend, a gateway with 4 connections says 503 until all 4 are up: a
    burst right after its first 200 meets no connection still in its reconnect backoff (whose calls
    would fail at once: the first-burst failures of issue 29)."""
    import json
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from tests.e2e.gateway_process import request_json
    from tests.e2e.processes import start_frontend, start_worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = start_gateway(f"127.0.0.1:{port}", "--frontend-connections", "4")
    worker = frontend = None
    try:
        status, body = request_json("GET", base_url(gateway) + "/health")
        assert status == 503, body
        worker = start_worker(tiny_model_dir)
        frontend = start_frontend(tiny_model_dir, worker.address, port=port)
        deadline = time.monotonic() + 30
        while request_json("GET", base_url(gateway) + "/health")[0] != 200:
            assert time.monotonic() < deadline, gateway.output()
            time.sleep(0.02)
        model = request_json("GET", base_url(gateway) + "/v1/models")[1]["data"][0]["id"]
        body = {"model": model, "prompt": "Hi", "max_tokens": 2}

        def complete(_: int) -> int:
            return request_json("POST", base_url(gateway) + "/v1/completions", body)[0]

        with ThreadPoolExecutor(CONNECTIONS) as pool:
            statuses = list(pool.map(complete, range(CONNECTIONS)))
        assert statuses == [200] * CONNECTIONS, json.dumps(statuses)
    finally:
        assert gateway.stop() == 0, gateway.output()
        for service in (frontend, worker):
            if service is not None:
                service.stop()
