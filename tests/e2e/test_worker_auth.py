"""Issue 32: the worker link has its own credential. A worker given --auth-token-file refuses every
WorkerService call without the bearer secret (UNAUTHENTICATED, before the request is read; health
stays open), its frontend passes it on, Abort reaches only the caller's own requests, and a fresh
`nanoserve serve` runs its worker with a per-run secret: no unauthenticated worker by default."""

import re
from pathlib import Path

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.security import bearer_metadata
from tests.e2e.processes import (
    WORKER_SERVICE,
    check_health,
    start_frontend,
    start_serve,
    start_worker,
)

pytestmark = pytest.mark.e2e


def _generate(address: str, token: str | None, max_tokens: int = 2):
    with grpc.insecure_channel(address) as channel:
        stub = worker_grpc.WorkerServiceStub(channel)
        request = worker_pb2.GenerateTokensRequest(
            prompt_token_ids=[1, 2, 3],
            sampling_params=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        return list(stub.GenerateTokens(request, timeout=30, metadata=bearer_metadata(token)))


def _code(address: str, token: str | None) -> grpc.StatusCode:
    try:
        _generate(address, token)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_a_worker_with_a_secret_answers_only_its_holders(tiny_model_dir: Path, tmp_path) -> None:
    token_file = tmp_path / "worker-token"
    token_file.write_text("frontend key-a\nother key-b\n")
    worker = start_worker(tiny_model_dir, "--auth-token-file", str(token_file))
    frontend_token = tmp_path / "frontend-token"
    frontend_token.write_text("key-a\n")
    frontend = start_frontend(
        tiny_model_dir, worker.address, "--worker-auth-token-file", str(frontend_token)
    )
    try:
        assert _code(worker.address, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(worker.address, "key-c") == grpc.StatusCode.UNAUTHENTICATED
        assert _code(worker.address, "key-a") == grpc.StatusCode.OK
        assert check_health(worker.address, WORKER_SERVICE) == "SERVING"  # open: probes
        with Client(frontend.address, timeout=30) as client:
            assert client.generate("Hello", max_tokens=3).usage.completion_tokens == 3
        # Abort reaches only the caller's own requests
        with grpc.insecure_channel(worker.address) as channel:
            stub = worker_grpc.WorkerServiceStub(channel)
            stream = stub.GenerateTokens(
                worker_pb2.GenerateTokensRequest(
                    request_id="mine",
                    prompt_token_ids=[1, 2, 3],
                    sampling_params=common_pb2.SamplingParams(max_tokens=3000, ignore_eos=True),
                ),
                timeout=60,
                metadata=bearer_metadata("key-a"),
            )
            next(stream)
            abort = worker_pb2.AbortRequest(request_ids=["mine"])
            other = stub.Abort(abort, timeout=10, metadata=bearer_metadata("key-b"))
            assert other.num_aborted == 0
            with pytest.raises(grpc.RpcError) as refused:
                stub.Abort(abort, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert next(stream).token_ids  # still running
            mine = stub.Abort(abort, timeout=10, metadata=bearer_metadata("key-a"))
            assert mine.num_aborted == 1
            with pytest.raises(grpc.RpcError) as ended:
                for _ in stream:
                    pass
            assert ended.value.code() == grpc.StatusCode.ABORTED
    finally:
        frontend.stop()
        worker.stop()


def test_a_worker_on_a_public_address_without_credentials_refuses_to_start(
    tiny_model_dir: Path,
) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "nanoserve.worker", "--model", str(tiny_model_dir),
         "--device", "cpu", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "auth_token_file" in result.stderr + result.stdout


def test_nanoserve_serve_gives_its_worker_a_per_run_secret(tiny_model_dir: Path) -> None:
    import tempfile

    secret_dirs = lambda: set(Path(tempfile.gettempdir()).glob("nanoserve-serve-*"))
    before = secret_dirs()
    serve = start_serve(tiny_model_dir)
    try:
        address = serve.wait_listening()
        match = re.search(r"worker on (\S+?)\)", serve.output(200))
        assert match, serve.output()
        worker = match.group(1)
        assert _code(worker, None) == grpc.StatusCode.UNAUTHENTICATED
        with Client(address, timeout=30) as client:
            assert client.generate("Hi", max_tokens=2).usage.completion_tokens == 2
        made = secret_dirs() - before
        assert len(made) == 1 and (made.pop() / "worker-token").stat().st_mode & 0o077 == 0
    finally:
        assert serve.stop() == 0
    assert secret_dirs() - before == set()  # removed on exit
