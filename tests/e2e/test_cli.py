"""The `nanoserve` console script end to end: `serve --port 0` runs a worker and a frontend, says where
it serves, `generate` streams text from it, and SIGTERM stops it with exit 0 and no child left.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.conftest import BLOCK_SIZE, REPO_ROOT, Service, cmdline, descendant_pids, pid_running

pytestmark = pytest.mark.e2e

SERVING = re.compile(r"nanoserve serving \S+ on (?P<host>\S+):(?P<port>\d+) \(worker on ")


def nanoserve() -> list[str]:
    """The installed console script, or the same entry point through the interpreter."""
    script = shutil.which("nanoserve")
    return [script] if script else [sys.executable, "-m", "nanoserve.cli"]


def test_serve_generate_and_sigterm(tiny_model_dir: Path, services) -> None:
    serve = Service(
        "nanoserve serve",
        [
            *nanoserve(),
            "serve",
            "--port",
            "0",
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--kvcache-block-size",
            str(BLOCK_SIZE),
            "--num-kvcache-blocks",
            "128",
        ],
        listening=SERVING,
    )
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
