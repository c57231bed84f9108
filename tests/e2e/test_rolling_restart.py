"""A rolling restart loses nothing (issue 33): two workers, two frontends sharing one port and two
gateways sharing another, each restarted in turn (SIGTERM, drain, exit 0, started again on the same
port, SERVING) while clients send requests at a steady rate: gRPC calls on one long-lived channel,
and OpenAI HTTP requests. Every request must succeed."""

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.gateway_process import request_json, start_gateway
from tests.e2e.processes import Service, start_frontend, start_worker

pytestmark = pytest.mark.e2e

GRACE = ("--grace-period-s", "10")
RATE_S = 0.1  # each client thread: a request every 0.1 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Load:
    """Client threads sending requests until stopped; every outcome kept."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def run(self, name: str, send: Callable[[], None]) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    send()
                    self.ok += 1
                except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                    self.failures.append(f"{name} at {time.strftime('%X')}: {e!r}"[:300])
                self.stop.wait(max(0.0, RATE_S - (time.monotonic() - started)))

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


@dataclass
class Stack:
    model_dir: Path
    workers: list[Service]
    frontends: list[Service]
    gateways: list[Service]
    frontend_port: int
    gateway_port: int
    retired: list[Service] = field(default_factory=list)  # the restarted ones, for their logs

    def log_lines(self, *words: str, most: int = 20) -> str:
        """Every service's log lines (the retired ones' too) holding any of `words`."""
        services = (*self.retired, *self.workers, *self.frontends, *self.gateways)
        hits = [
            f"{s.name}: {line.rstrip()}"
            for s in services
            for line in s.lines
            if any(w in line for w in words)
        ]
        return "\n".join(hits[-most:])

    @property
    def worker_address(self) -> str:
        return ",".join(w.address for w in self.workers)

    def start_worker(self, port: int) -> Service:
        return start_worker(self.model_dir, *GRACE, port=port)

    def start_frontend(self) -> Service:
        return start_frontend(
            self.model_dir, self.worker_address, *GRACE, "--reuse-port", port=self.frontend_port
        )

    def start_gateway(self) -> Service:
        return start_gateway(
            f"127.0.0.1:{self.frontend_port}",
            *("--grace-period-s", "10", "--reuse-port", "--port", str(self.gateway_port)),
        )


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path) -> Iterator[Stack]:
    s = Stack(tiny_model_dir, [], [], [], free_port(), free_port())
    try:
        s.workers = [s.start_worker(0) for _ in range(2)]
        s.frontends = [s.start_frontend() for _ in range(2)]
        s.gateways = [s.start_gateway() for _ in range(2)]
        yield s
    finally:
        for service in (*s.gateways, *s.frontends, *s.workers):
            service.stop()


def restart(stack: Stack, old: Service, start: Callable[[], Service]) -> Service:
    """SIGTERM, a drain that ends in exit 0, then the replacement, serving."""
    old.signal(signal.SIGTERM)
    assert old.wait(timeout=30) == 0, old.output()
    stack.retired.append(old)
    return start()


def test_a_rolling_restart_of_every_service_fails_no_request(stack: Stack) -> None:
    model = request_json("GET", f"http://127.0.0.1:{stack.gateway_port}/v1/models")[1]["data"][0]
    body = {"model": model["id"], "prompt": "The sea", "max_tokens": 8}
    load = Load()
    with Client(f"127.0.0.1:{stack.frontend_port}", timeout=30) as client:
        client.wait_ready(timeout=30)

        def grpc_call() -> None:
            completion = client.generate("Once upon a time", max_tokens=8)
            assert completion.usage.completion_tokens == 8

        def http_call() -> None:
            status, reply = request_json(
                "POST", f"http://127.0.0.1:{stack.gateway_port}/v1/completions", body
            )
            assert status == 200, reply

        for i in range(2):
            load.run(f"grpc-{i}", grpc_call)
            load.run(f"http-{i}", http_call)
        try:
            time.sleep(1.0)
            for i, worker in enumerate(list(stack.workers)):
                stack.workers[i] = restart(
                    stack, worker, lambda p=worker.port: stack.start_worker(p)
                )
                time.sleep(1.0)  # the frontends find it again (their poll) before the next goes
            for i, frontend in enumerate(list(stack.frontends)):
                stack.frontends[i] = restart(stack, frontend, stack.start_frontend)
                time.sleep(0.5)
            for i, gateway in enumerate(list(stack.gateways)):
                stack.gateways[i] = restart(stack, gateway, stack.start_gateway)
                time.sleep(0.5)
            time.sleep(1.0)
        finally:
            load.end()
    # a failure's message carries what the services logged about cancelled or refused calls
    assert not load.failures, f"{len(load.failures)} of {load.ok + len(load.failures)}: " + (
        "\n".join(load.failures[:10])
        + "\nservices:\n"
        + stack.log_lines("CANCELLED", "UNAVAILABLE", "cancel", "Traceback")
    )
    assert load.ok > 100


def test_a_request_a_draining_worker_refuses_goes_to_another(tiny_model_dir: Path) -> None:
    """The window of a rolling restart, made permanent: one of two workers refuses every request
    UNAVAILABLE ("shutting down") while its load says idle (tests/e2e/refusing_worker.py). Each
    refused request goes to the other worker before the client sees anything: every call
    succeeds."""
    py = [sys.executable, "-m"]
    bad = Service("refusing worker", [*py, "tests.e2e.refusing_worker", str(tiny_model_dir)])
    good = Service(
        "stand-in worker",
        [*py, "nanoserve.benchmarks.frontend_cost", "--stand-in-worker"]
        + ["--model", str(tiny_model_dir), "--step-ms", "5"],
    )
    try:
        addresses = f"{bad.wait_listening()},{good.wait_listening()}"
        frontend = start_frontend(tiny_model_dir, addresses)
        try:
            with Client(frontend.address, timeout=30) as client:
                client.wait_ready(timeout=30)
                for i in range(24):  # short prompts hash apart: about half go to `bad` first
                    completion = client.generate(f"prompt number {i}", max_tokens=3)
                    assert completion.usage.completion_tokens == 3
        finally:
            assert frontend.stop() == 0, frontend.output()
    finally:
        bad.stop()
        good.stop()
    assert any(line.startswith("refused ") for line in bad.lines)  # the refusal path ran
