"""The `nanoserve` console script end to end: `serve --port 0` runs a worker and a frontend, says
where it serves, `generate` streams text from it, SIGTERM stops it with exit 0 and no child left,
and a SIGKILLed `serve` takes its services with it.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanoserve.client import Client
from nanoserve.process import check_port_free
from tests.e2e.processes import REPO_ROOT, cmdline, descendant_pids, pid_running, start_serve

pytestmark = pytest.mark.e2e


def nanoserve() -> list[str]:
    """The installed console script, or the same entry point through the interpreter."""
    script = shutil.which("nanoserve")
    return [script] if script else [sys.executable, "-m", "nanoserve.cli"]


def test_serve_generate_and_sigterm(tiny_model_dir: Path, services) -> None:
    serve = start_serve(tiny_model_dir, command=tuple(nanoserve()))
    children: list[int] = []
    try:
        address = serve.wait_listening()  # printed once both services are SERVING
        children = descendant_pids(serve.pid)
        assert len(children) >= 2, children  # the worker and the frontend
        prompt = "The capital of France is"
        result = subprocess.run(
            [
                *nanoserve(),
                "generate",
                "--address",
                address,
                "--max-tokens",
                "16",
                "--temperature",
                "0",
                "--usage",
                prompt,
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        with Client(services.frontend.address, timeout=30) as client:  # same model, other server
            want = client.generate(prompt, temperature=0, max_tokens=16)
        assert result.stdout == want.text + "\n"
        assert "finish_reason=length" in result.stderr and "completion_tokens=16" in result.stderr

        serve.signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, serve.output()
        assert not [cmdline(pid) for pid in children if pid_running(pid)]
    finally:
        if serve.alive():
            serve.kill()
        for pid in children:  # its services run in their own sessions: end any left by pid
            if pid_running(pid) and any(
                name in cmdline(pid)
                for name in ("-m nanoserve.worker", "-m nanoserve.frontend", "multiprocessing")
            ):
                os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_serve_takes_its_services_with_it(tiny_model_dir: Path) -> None:
    """The kernel signals each service when `serve` dies (PR_SET_PDEATHSIG): no process is left
    running and both ports can be bound again."""
    port, worker_port = free_port(), free_port()
    serve = start_serve(
        tiny_model_dir,
        *("--port", str(port), "--worker-port", str(worker_port)),
        command=tuple(nanoserve()),
    )
    children: list[int] = []
    try:
        serve.wait_listening()
        children = descendant_pids(serve.pid)  # worker, frontend, the engine core
        assert len(children) >= 3, [cmdline(pid) for pid in children]
        assert serve.kill() == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(pid_running(pid) for pid in children):
            time.sleep(0.1)
        assert not [cmdline(pid) for pid in children if pid_running(pid)]
        check_port_free("127.0.0.1", port)  # raises ValueError while a process still binds it
        check_port_free("127.0.0.1", worker_port)
    finally:
        if serve.alive():
            serve.kill()
        for pid in children:
            if pid_running(pid) and any(
                name in cmdline(pid)
                for name in ("-m nanoserve.worker", "-m nanoserve.frontend", "multiprocessing")
            ):
                os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
