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
