"""Idle and slow connections are bounded by flags (issue 33): hundreds of slow-header HTTP
connections on the gateway, and on the frontend hundreds of TCP connections that never finish the
HTTP/2 handshake plus idle HTTP/2 connections, while a health prober (another process) watches the
frontend and requests go through. Health stays fast, requests are served, and each kind of
connection is closed by the server once its flag's time is up."""

import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.gateway_process import base_url, start_gateway
from tests.e2e.processes import FRONTEND_SERVICE, Pair, Service, start_pair
from tests.e2e.test_hostile_clients_inputs import HealthProber

pytestmark = pytest.mark.e2e

TIMEOUT_S = 2.0  # every bound under test
EACH = 300  # connections of each kind
# the HTTP/2 client preface and an empty SETTINGS frame: the client's side of the handshake
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@dataclass
class Bounded:
    pair: Pair
    gateway: Service


@pytest.fixture(scope="module")
def bounded(tiny_model_dir: Path) -> Iterator[Bounded]:
    seconds = str(TIMEOUT_S)
    pair = start_pair(
        tiny_model_dir,
        frontend_args=("--handshake-timeout-s", seconds, "--connection-idle-timeout-s", seconds),
    )
    try:
        gateway = start_gateway(
            pair.frontend.address, "--header-timeout-s", seconds, "--keep-alive-timeout-s", seconds
        )
    except BaseException:
        pair.stop()
        raise
    yield Bounded(pair, gateway)
    assert gateway.stop() == 0, gateway.output()
    pair.stop()


def _connect(address: str, first_bytes: bytes) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Reads until EOF (or a reset) or the deadline: whether the server closed it."""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def test_slow_and_idle_connections_are_closed_and_nothing_else_waits(bounded: Bounded) -> None:
    frontend = bounded.pair.frontend.address
    gateway = f"127.0.0.1:{bounded.gateway.port}"
    with HealthProber({frontend: FRONTEND_SERVICE}) as prober:
        opened = time.monotonic()
        slow_headers = [
            _connect(gateway, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(EACH)
        ]
        no_handshake = [_connect(frontend, b"") for _ in range(EACH)]
        idle_h2 = [_connect(frontend, H2_PREFACE) for _ in range(EACH // 3)]
        # everyone else is served meanwhile
        with urllib.request.urlopen(base_url(bounded.gateway) + "/health", timeout=5) as reply:
            assert reply.status == 200
        with Client(frontend, timeout=30) as client:
            assert client.generate("Hello", max_tokens=4).usage.completion_tokens == 4
        deadline = opened + TIMEOUT_S + 15.0  # the bound, and slack for a loaded machine
        open_left = {
            "slow headers (gateway)": [
                s for s in slow_headers if not _closed_by_server(s, deadline)
            ],
            "no handshake (frontend)": [
                s for s in no_handshake if not _closed_by_server(s, deadline)
            ],
            "idle HTTP/2 (frontend)": [s for s in idle_h2 if not _closed_by_server(s, deadline)],
        }
        closed_after = time.monotonic() - opened
    for sock in (*slow_headers, *no_handshake, *idle_h2):
        sock.close()
    assert {kind: len(left) for kind, left in open_left.items()} == dict.fromkeys(open_left, 0)
    assert closed_after >= TIMEOUT_S * 0.9  # closed by the flags' bound, not at once
    assert prober.worst()[frontend] < 1.0, prober.worst()
    assert prober.probes[frontend] > 10
