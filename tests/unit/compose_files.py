"""The deployment files' paths and readers for their tests: docker-compose.yml with `${VAR:-default}`
resolved as compose does (PyYAML; its tests skip without it), the config classes, helpers to run
docker-compose and load docker/healthcheck.py. No docker engine is needed."""

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.proto.v1 import frontend_service_pb2, worker_service_pb2
from nanoserve.worker.config import WorkerConfig

yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose.yml (pip install pyyaml)")
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILES = {
    "worker": ROOT / "docker/worker.Dockerfile",
    "frontend": ROOT / "docker/frontend.Dockerfile",
    "gateway": ROOT / "docker/gateway.Dockerfile",
}
CONFIGS: dict[str, type] = {
    "worker": WorkerConfig,
    "frontend": FrontendConfig,
    "gateway": GatewayConfig,
}
GRPC_SERVICES = {
    "worker": worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    "frontend": frontend_service_pb2.DESCRIPTOR.services_by_name["FrontendService"].full_name,
}
HEALTHCHECK_IN_IMAGE = "/opt/nanoserve/healthcheck.py"
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def load_compose(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml with `${VAR:-default}` resolved from `env` (not os.environ), as compose does."""
    env = env or {}
    text = INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), COMPOSE.read_text())
    return yaml.safe_load(text)


def seconds(duration: str) -> float:
    """Compose durations: "40s", "10m", "1m30s"."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def default(cls: type, name: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")}
    return env | extra


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """argv in the repository root, without the caller's NANOSERVE_* variables."""
    return subprocess.run(
        argv,
        check=False,
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def compose_v1() -> list[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed (apt-get install -y docker-compose)")
    return ["docker-compose", "-f", str(COMPOSE)]


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("healthcheck", ROOT / "docker/healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TLS_LINE = re.compile(r"^(\s*)#tls ", re.MULTILINE)
CERTS_IN_IMAGE = "/certs"


def load_compose_tls(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml with its `#tls ` lines uncommented, as its header says to turn TLS on."""
    env = env or {}
    text = TLS_LINE.sub(r"\1", COMPOSE.read_text())
    text = INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), text)
    return yaml.safe_load(text)


def container_env(service: dict, certs_dir: Path) -> dict[str, str]:
    """The service's environment with /certs/... pointing into `certs_dir` (the mount's source)."""
    return {
        k: str(v).replace(CERTS_IN_IMAGE + "/", f"{certs_dir}/")
        for k, v in service["environment"].items()
    }
