"""The end-to-end tests' service processes: the real worker and frontend (or `nanoserve serve`) as
processes on 127.0.0.1, their argv, health and load checks (the fixtures are in conftest.py).

Services bind port 0 and the test reads the port from their "listening on" line; every caller
stops exactly the processes it started, by handle (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_SERVICE = "nanoserve.v1.WorkerService"
FRONTEND_SERVICE = "nanoserve.v1.FrontendService"
BLOCK_SIZE = 16
NUM_BLOCKS = 512  # 8192 slots: max_model_len stays the model's 4096
START_TIMEOUT_S = 90.0  # loading torch and the model on a busy 2-core machine
LISTENING = re.compile(r"(worker|frontend) listening on (?P<host>\S+):(?P<port>\d+)")


class Service:
    """A service process started by a test; keeps its output for failure messages."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        listening: re.Pattern[str] = LISTENING,
        cwd: Path = REPO_ROOT,
    ) -> None:
        """`listening` finds the address in the output: named groups `host` and `port`."""
        self.name = name
        self.argv = argv
        self.lines: list[str] = []
        self.address: str | None = None
        self._pattern = listening
        self._listening = threading.Event()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._reader.start()
        atexit.register(self._kill_if_alive)  # an interrupted session leaves no process behind

    def _kill_if_alive(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait(5)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        assert self.address is not None
        return int(self.address.rpartition(":")[2])

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            match = self._pattern.search(line)
            if match and not self._listening.is_set():
                self.address = f"{match['host']}:{match['port']}"
                self._listening.set()

    def output(self, last: int = 40) -> str:
        return "".join(self.lines[-last:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            if not self.alive():
                self._reader.join(2.0)
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} before "
                    f"listening:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not listening after {timeout} s:\n{self.output()}")
        return self.address

    def wait_serving(self, service: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.wait_listening(timeout)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while health_status(stub, service) != "SERVING":
                if not self.alive():
                    raise RuntimeError(
                        f"{self.name} exited with {self.process.returncode}:\n{self.output()}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.name} not SERVING after {timeout} s:\n{self.output()}"
                    )
                time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (the service drains), SIGKILL after `timeout`; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def children(self) -> list[int]:
        return child_pids(self.pid)


def child_pids(pid: int) -> list[int]:
    """Direct children of a process, from /proc (no psutil)."""
    pids: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids.extend(int(p) for p in children.read_text().split())
        except OSError:  # the thread or the process ended meanwhile
            continue
    return sorted(set(pids))


def descendant_pids(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in child_pids(todo.pop()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def pid_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def health_status(stub: health_pb2_grpc.HealthStub, service: str, timeout: float = 1.0) -> str:
    """The service's health status name, or the gRPC code name when the check itself failed."""
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as e:
        return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def check_health(address: str, service: str) -> str:
    with grpc.insecure_channel(address) as channel:
        return health_status(health_pb2_grpc.HealthStub(channel), service)


def worker_argv(model_dir: Path, *args: str, port: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nanoserve.worker",
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--port",
        str(port),
        "--kvcache-block-size",
        str(BLOCK_SIZE),
        "--num-kvcache-blocks",
        str(NUM_BLOCKS),
        *args,
    ]


def frontend_argv(model_dir: Path, worker_address: str, *args: str, port: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nanoserve.frontend",
        "--model",
        str(model_dir),
        "--worker-address",
        worker_address,
        "--port",
        str(port),
        *args,
    ]


# what `nanoserve serve` prints once both of its services are SERVING
SERVE_LISTENING = re.compile(r"nanoserve serving \S+ on (?P<host>\S+):(?P<port>\d+) \(worker on ")


def start_serve(model_dir: Path, *args: str, command: tuple[str, ...] = ()) -> Service:
    """`nanoserve serve` (through `command`, default `python -m nanoserve.cli`) on `model_dir` with
    a small CPU cache, on a free port unless `args` name one; call wait_listening() on it."""
    argv = [
        *(command or (sys.executable, "-m", "nanoserve.cli")), "serve",
        "--model", str(model_dir), "--device", "cpu",
        "--kvcache-block-size", str(BLOCK_SIZE), "--num-kvcache-blocks", "128",
        *(() if "--port" in args else ("--port", "0")), *args,
    ]  # fmt: skip
    return Service("nanoserve serve", argv, listening=SERVE_LISTENING)


def start_worker(model_dir: Path, *args: str, port: int = 0, wait: bool = True) -> Service:
    worker = Service("worker", worker_argv(model_dir, *args, port=port))
    try:
        worker.wait_serving(WORKER_SERVICE) if wait else worker.wait_listening()
    except BaseException:
        worker.kill()
        raise
    return worker


def start_frontend(
    model_dir: Path, worker_address: str, *args: str, port: int = 0, wait: bool = True
) -> Service:
    frontend = Service("frontend", frontend_argv(model_dir, worker_address, *args, port=port))
    try:
        frontend.wait_serving(FRONTEND_SERVICE) if wait else frontend.wait_listening()
    except BaseException:
        frontend.kill()
        raise
    return frontend


class Pair:
    """A worker and the frontend in front of it."""

    def __init__(self, worker: Service, frontend: Service) -> None:
        self.worker, self.frontend = worker, frontend

    def stop(self) -> tuple[int, int]:
        """Frontend first, so that nothing reaches a stopped worker."""
        return self.frontend.stop(), self.worker.stop()


def start_pair(
    model_dir: Path, worker_args: tuple[str, ...] = (), frontend_args: tuple[str, ...] = ()
) -> Pair:
    """Starts both processes at once (the frontend connects when the worker is ready)."""
    worker = start_worker(model_dir, *worker_args, wait=False)
    try:
        frontend = start_frontend(model_dir, worker.address, *frontend_args, wait=False)
    except BaseException:
        worker.kill()
        raise
    try:
        worker.wait_serving(WORKER_SERVICE)
        frontend.wait_serving(FRONTEND_SERVICE)
    except BaseException:
        frontend.kill()
        worker.kill()
        raise
    return Pair(worker, frontend)


def get_load(worker_address: str) -> worker_pb2.GetLoadResponse:
    with grpc.insecure_channel(worker_address) as channel:
        stub = worker_grpc.WorkerServiceStub(channel)
        return stub.GetLoad(worker_pb2.GetLoadRequest(), timeout=5)


def wait_idle(worker_address: str, timeout: float = 5.0) -> worker_pb2.GetLoadResponse:
    """Polls GetLoad until no request runs or waits and every KV block is free (or the timeout
    passes); returns the last answer for the caller to assert on."""
    deadline = time.monotonic() + timeout
    while True:
        load = get_load(worker_address)
        idle = (
            load.num_running == 0
            and load.num_waiting == 0
            and load.num_free_blocks == load.num_total_blocks
        )
        if idle or time.monotonic() > deadline:
            return load
        time.sleep(0.05)


def assert_idle(worker_address: str, num_blocks: int = NUM_BLOCKS, timeout: float = 5.0) -> None:
    """Nothing runs or waits on the worker and all its `num_blocks` KV blocks are free."""
    load = wait_idle(worker_address, timeout)
    assert (load.num_running, load.num_waiting) == (0, 0), load
    assert load.num_free_blocks == load.num_total_blocks == num_blocks, load
