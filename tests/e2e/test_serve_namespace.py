"""`nanoserve serve` from a directory that holds its own `worker`, `frontend` and `shared` packages
(a Celery or Django project, say) starts nanoserve's services, never the user's.
"""

import os
import signal
import sys
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.processes import (
    BLOCK_SIZE,
    SERVE_LISTENING,
    Service,
    cmdline,
    descendant_pids,
    pid_running,
)

pytestmark = pytest.mark.e2e


def test_serve_from_a_directory_with_its_own_worker_package(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    for package in ("worker", "frontend", "shared"):
        (tmp_path / package).mkdir()
        for module in ("__init__.py", "__main__.py"):
            (tmp_path / package / module).write_text("raise SystemExit('the user package ran')\n")
    argv = [
        sys.executable,
        "-m",
        "nanoserve.cli",
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
        "64",
        "--no-enable-reflection",
    ]
    serve = Service("nanoserve serve", argv, listening=SERVE_LISTENING, cwd=tmp_path)
    children: list[int] = []
    try:
        address = serve.wait_listening()
        children = descendant_pids(serve.pid)
        with Client(address, timeout=30) as client:
            assert (
                client.generate("Hello", max_tokens=4, temperature=0).usage.completion_tokens == 4
            )
        assert "the user package ran" not in serve.output(200)
        serve.signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, serve.output()
    finally:
        if serve.alive():
            serve.kill()
        for pid in children:
            if pid_running(pid) and "nanoserve" in cmdline(pid):
                os.kill(pid, signal.SIGKILL)
