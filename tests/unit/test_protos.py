"""The committed stubs in shared/proto/ match what protos/generate.py makes from the protos."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMITTED = REPO_ROOT / "shared" / "proto"


def _load_generate_module():
    path = REPO_ROOT / "protos" / "generate.py"
    spec = importlib.util.spec_from_file_location("protos_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    _load_generate_module().generate(tmp_path)
    fresh, committed = _tree(tmp_path), _tree(COMMITTED)
    hint = "run `python protos/generate.py` and commit shared/proto"
    assert sorted(fresh) == sorted(committed), hint
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: {hint}"


def test_stubs_import_with_relative_imports() -> None:
    from nanoserve.proto.v1 import common_pb2
    from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
    from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
    from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
    from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

    params = common_pb2.SamplingParams(temperature=0.0, stop=["\n"])
    assert params.HasField("temperature") and not params.HasField("top_p")
    request = worker_pb2.GenerateTokensRequest(
        request_id="r", prompt_token_ids=[1, 2], sampling_params=params
    )
    assert worker_pb2.GenerateTokensRequest.FromString(request.SerializeToString()) == request
    response = frontend_pb2.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH)
    assert response.finish_reason == 2
    assert hasattr(frontend_grpc, "FrontendServiceStub")
    assert hasattr(worker_grpc, "WorkerServiceStub")
    assert frontend_pb2.DESCRIPTOR.package == "nanoserve.v1"
    services = worker_pb2.DESCRIPTOR.services_by_name
    assert {s.full_name for s in services.values()} == {"nanoserve.v1.WorkerService"}


BUF = Path(__file__).resolve().parents[2] / "protos" / "node_modules" / ".bin" / "buf"


@pytest.mark.skipif(
    not BUF.exists(),
    reason="buf is installed by `npm ci --prefix protos` "
    "(scripts/test.sh does it when npm is present)",
)
def test_buf_lint_standard():
    repo = BUF.parents[3]
    result = subprocess.run(
        [str(BUF), "lint"], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _lower_bound(requirement: str) -> tuple[int, ...]:
    match = re.search(r">=\s*([\d.]+)", requirement)
    assert match, f"{requirement!r} has no lower bound"
    return tuple(int(part) for part in match.group(1).split("."))


def test_stub_versions_fit_the_pinned_lower_bounds() -> None:
    """The stubs refuse to import under a grpcio/protobuf older than their generator's: the
    pyproject's lower bounds must admit them (the GPU image has grpcio 1.84.0, protobuf 7.36)."""
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.match(r"[\w-]+", d).group(0): d for d in deps}
    grpc_floor, protobuf_floor = _lower_bound(pins["grpcio"]), _lower_bound(pins["protobuf"])
    for path in sorted((COMMITTED / "v1").glob("*_pb2_grpc.py")):
        generated = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", path.read_text()).group(1)
        assert tuple(map(int, generated.split("."))) <= grpc_floor, (path.name, generated)
    runtime_check = re.compile(
        r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),"
    )
    for path in sorted((COMMITTED / "v1").glob("*_pb2.py")):
        required = tuple(int(v) for v in runtime_check.search(path.read_text()).groups())
        assert required <= protobuf_floor, (path.name, required)
