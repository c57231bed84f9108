"""The services `nanoserve bench serving` measures, started as processes on loopback (`python -m
nanoserve.worker` / `nanoserve.frontend` / `nanoserve.frontend.gateway`), their logs copied to
stderr so that stdout keeps only figures; and the CPU time each one's process tree spends while a
run goes on.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from nanoserve.benchmarks.process_counters import tree_counters
from nanoserve.process import FRONTEND_SERVICE, WORKER_SERVICE
from nanoserve.process import is_serving as _serving

LISTENING = re.compile(r"(worker|frontend|gateway) listening on (\S+):(\d+)")


def _http_ok(address: str | None) -> bool:
    """The gateway's readiness: GET /health answers 200 (its frontend is SERVING)."""
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Service:
    def __init__(self, name: str, argv: list[str], kind: str = "") -> None:
        """`kind`: worker, frontend or gateway (default: the name; replicas are frontend-2, ...)."""
        self.name = name
        self.kind = kind or name
        self.address: str | None = None
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        assert self.process.stdout is not None  # stdout=PIPE
        for line in self.process.stdout:
            sys.stderr.write(f"[{self.name}] {line}")
            match = LISTENING.search(line)
            if match and match.group(1) == self.kind and not self._listening.is_set():
                self.address = f"{match.group(2)}:{match.group(3)}"
                self._listening.set()

    def wait_serving(self, timeout_s: float) -> str:
        """Blocks until the health service says SERVING; returns the address."""
        service = WORKER_SERVICE if self.kind == "worker" else FRONTEND_SERVICE
        ready = (
            (lambda: _http_ok(self.address))
            if self.kind == "gateway"
            else (lambda: _serving(self.address, service))
        )
        deadline = time.monotonic() + timeout_s
        while not (self._listening.is_set() and ready()):
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.name} exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} was not serving after {timeout_s:.0f} s")
            time.sleep(0.2)
        assert self.address is not None  # set before _listening
        return self.address

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the service drains and stops its own ranks or engine process), then SIGKILL to
        what is left of its process group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its session: ours alone
        except ProcessLookupError:
            pass
        self.process.wait()


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (Linux /proc; 0 elsewhere)."""
    return tree_counters(pid)["cpu_s"]


def start_replicas(
    services: dict[str, Service], kind: str, argv: list[str], count: int, timeout_s: float
) -> str:
    """`count` processes of one service sharing one port (SO_REUSEPORT when several, as `nanoserve
    serve --frontend-processes` runs them), named kind, kind-2, ...; their address."""
    shared = ["--reuse-port"] if count > 1 else []
    first = services[kind] = Service(kind, [*argv, "--port", "0", *shared])
    address = first.wait_serving(timeout_s)
    for i in range(2, count + 1):
        port = address.rsplit(":", 1)[1]
        services[f"{kind}-{i}"] = Service(f"{kind}-{i}", [*argv, "--port", port, *shared], kind)
        services[f"{kind}-{i}"].wait_serving(timeout_s)
    return address


def start_services(
    worker_flags: list[str], model: str, target: str, args: argparse.Namespace
) -> dict[str, Service]:
    """The worker, and for the frontend, gateway and all targets the frontend, and for the
    gateway and all targets the gateway in front of it; each waited for until it serves."""
    py = [sys.executable, "-m"]
    worker = Service(
        "worker",
        [
            *py,
            "nanoserve.worker",
            "--port",
            "0",
            *worker_flags,
            *shlex.split(args.worker_args),
        ],
    )
    services = {"worker": worker}
    try:
        worker_address = worker.wait_serving(args.start_timeout)
        if target in ("frontend", "both", "gateway", "chat", "openai", "all"):
            frontend_address = start_replicas(
                services,
                "frontend",
                [*py, "nanoserve.frontend", "--model", model, "--worker-address", worker_address,
                 *shlex.split(args.frontend_args)],
                args.frontend_processes,
                120,
            )  # fmt: skip
            if target in ("gateway", "chat", "openai", "all"):
                start_replicas(
                    services,
                    "gateway",
                    [*py, "nanoserve.frontend.gateway", "--frontend-address", frontend_address,
                     *shlex.split(args.gateway_args)],
                    args.frontend_processes,
                    60,
                )  # fmt: skip
    except BaseException:
        for s in services.values():
            s.stop(10.0)
        raise
    return services
