"""Service processes seen from outside: start one as a child and follow its "listening on" line, ask
its gRPC health, check a port is free before binding it. Used by `nanoserve serve` and the serving
benchmark; imports neither service.
"""

import contextlib
import ctypes
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

WORKER_SERVICE = "nanoserve.v1.WorkerService"
FRONTEND_SERVICE = "nanoserve.v1.FrontendService"
LISTENING = re.compile(r"(worker|frontend|gateway) listening on (\S+):(\d+)")
STOP_TIMEOUT_S = 40.0  # per child: its own drain grace (30 s by default) plus some slack
PR_SET_PDEATHSIG = 1  # linux/prctl.h


PARENT_PID_ENV = "NANOSERVE_PARENT_PID"  # set by Child: the process its service should die with


def die_with(parent: int) -> None:
    """Has the kernel send this process SIGTERM when the thread that started it ends, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG; elsewhere a no-op), and exits now if `parent` is already
    gone (then no signal would ever come)."""
    with contextlib.suppress(OSError, AttributeError):  # prctl is Linux's
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:
        os._exit(1)


def die_with_starter() -> None:
    """Called first by each service's main(): where a Child started it ($NANOSERVE_PARENT_PID,
    taken out of the environment so the service's own children do not inherit it), die_with that
    parent. Set here rather than in a Popen preexec_fn: a preexec_fn makes CPython fork() instead
    of vfork() and run the parent's fork handlers in the child, and with the parent's gRPC
    channels live those crash the child before it execs (grpc/grpc#43055, grpcio 1.80 on; seen
    here once as a frontend that "aborted at start" in `ev_epoll1_linux.cc`, 2026-12-06)."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if parent.isdigit():
        die_with(int(parent))


class Child:
    """A service process whose stdout is copied to ours, watching for its "listening on" line.
    It gets SIGTERM when the thread that made it ends (build it on the main thread; the service's
    main() asks for it: die_with_starter): a parent killed by any means leaves no service behind."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.address: str | None = None
        self.listening = threading.Event()
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # signals come from us, in order
            env={**os.environ, PARENT_PID_ENV: str(os.getpid())},  # (die_with_starter)
        )
        threading.Thread(target=self._relay, args=(self.process.stdout,), daemon=True).start()

    def _relay(self, stream: IO[str]) -> None:
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = LISTENING.search(line)
            if match and match.group(1) == self.name and not self.listening.is_set():
                self.address = f"{match.group(2)}:{match.group(3)}"
                self.listening.set()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (the service drains), then SIGKILL after `timeout`; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"nanoserve: {self.name} did not stop in {timeout:.0f} s; killing it",
                    file=sys.stderr,
                )
                self.process.kill()
        return self.process.wait()


def wait_until(
    predicate: Callable[[], bool], children: list[Child], stop: threading.Event, what: str
) -> bool:
    """Polls predicate() until true; False when a child exited or a stop signal arrived."""
    while not predicate():
        for child in children:
            if not child.alive():
                print(
                    f"nanoserve: {child.name} exited with code {child.process.returncode} "
                    f"while {what}",
                    file=sys.stderr,
                )
                return False
        if stop.wait(0.1):
            return False
    return True


def is_serving(
    address: str | None, service: str, credentials: grpc.ChannelCredentials | None = None
) -> bool:
    """True when `service` at `address` answers the gRPC health check with SERVING (over TLS
    with `credentials`)."""
    if address is None:
        return False
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def check_port_free(host: str, port: int, flag: str = "--port") -> None:
    """Raises ValueError naming the fix when nothing could bind host:port now (port 0: any port).

    Binds as gRPC does (SO_REUSEADDR, no SO_REUSEPORT: see nanoserve.grpc_options), so a port in
    TIME_WAIT passes and a port another server holds does not."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"{flag} {port}: {host}:{port} is already in use (another nanoserve?); stop "
                    f"that process or pick another port ({flag} 0 takes any free one)"
                ) from None
            raise ValueError(f"{flag} {port}: cannot bind {host}:{port} ({e.strerror})") from None
