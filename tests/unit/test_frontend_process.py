"""`python -m nanoserve.frontend` as a process (port 0, the listening line, NOT_SERVING without a worker,
SIGTERM exits 0), and the boundary rule: shared/ and frontend/ import without torch."""

import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_modules_import_without_torch() -> None:
    modules = [
        "nanoserve.frontend.server",
        "nanoserve.frontend.__main__",
        "nanoserve.client",
        "nanoserve.cli",
        "nanoserve.config",
        "nanoserve.errors",
        "nanoserve.log",
        "nanoserve.model_files",
    ]
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises
        + "".join(f"import {m}\n" for m in modules)
        + "assert 'torch' not in {k for k, v in sys.modules.items() if v is not None}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_frontend_process_lifecycle(tiny_model_dir: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nanoserve.frontend",
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
            "--worker-address",
            "127.0.0.1:1",
            "--grace-period-s",
            "5",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = None
        for line in process.stdout:
            match = re.search(r"frontend listening on 127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, "no listening line"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="nanoserve.v1.FrontendService"), timeout=5
            )
        assert response.status == health_pb2.HealthCheckResponse.NOT_SERVING  # no worker
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert "frontend stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_bad_flag_is_a_clean_error() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanoserve.frontend",
            "--model",
            "tiny",
            "--max-concurrent-requests",
            "0",
        ],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "max_concurrent_requests must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr
