"""The deployment files' paths and readers for their tests: docker-compose.yml with `${VAR:-default}`
resolved as compose does (PyYAML; its tests skip without it), its overrides merged onto it, the
config classes, helpers to run docker-compose and load docker/healthcheck.py. No docker engine is
needed."""

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nanoserve.config import env_prefix, env_var
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.proto.v1 import frontend_service_pb2, worker_service_pb2
from nanoserve.worker.config import WorkerConfig

yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose.yml (pip install pyyaml)")
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SCALED = ROOT / "docker-compose.scaled.yml"
CPU = ROOT / "docker-compose.cpu.yml"
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
# The worker-auth contract (issue 32): the worker requires the secret in this file, the frontend
# sends it. Their config fields arrive with the worker authentication change; until then these are
# the only names the compose file may set that no config class has (once merged, they add nothing).
WORKER_AUTH_VARS = {
    "worker": "NANOSERVE_WORKER_AUTH_TOKEN_FILE",
    "frontend": "NANOSERVE_FRONTEND_WORKER_AUTH_TOKEN_FILE",
}


def config_env_names(name: str) -> set[str]:
    """The variables service `name`'s config reads, plus its worker-auth one while that is pending."""
    cls = CONFIGS[name]
    fields = {env_var(f.name, env_prefix(cls)) for f in dataclasses.fields(cls)}
    pending = {WORKER_AUTH_VARS[name]} if name in WORKER_AUTH_VARS else set()
    return fields | pending


INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def load_compose(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml with `${VAR:-default}` resolved from `env` (not os.environ), as compose does."""
    env = env or {}
    text = INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), COMPOSE.read_text())
    return yaml.safe_load(text)


RESET = object()  # compose's `!reset` tag: the override drops the key


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)


def merge(base: dict, override: dict) -> dict:
    """Compose's merge of an override file, for what these files override: mappings key by key,
    `!reset` drops the key, a `volumes` list merges by each mount's target, other values replace."""
    out = dict(base)
    for key, value in override.items():
        if value is RESET:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = merge(base[key], value)
        elif key == "volumes" and isinstance(value, list) and isinstance(base.get(key), list):
            by_target = {mount.split(":")[1]: mount for mount in value}
            kept = [by_target.pop(mount.split(":")[1], mount) for mount in base[key]]
            out[key] = kept + list(by_target.values())
        else:
            out[key] = value
    return out


def load_stack(*paths: Path, env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml and its overrides (`-f` after `-f`), `${VAR:-default}` resolved from env."""
    env = env or {}
    files = [
        yaml.load(
            INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), path.read_text()),
            Loader=_ComposeLoader,
        )
        for path in paths
    ]
    stack = files[0]
    for override in files[1:]:
        stack = merge(stack, override)
    return stack


MISSING = object()  # a key one side of a `differences` lacks


def differences(a: object, b: object, path: tuple = ()) -> dict[tuple, tuple]:
    """Every leaf path where two loaded compose files differ (a list is one leaf), both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: dict[tuple, tuple] = {}
        for key in a.keys() | b.keys():
            out |= differences(a.get(key, MISSING), b.get(key, MISSING), (*path, key))
        return out
    return {} if a == b else {path: (a, b)}


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


def image_extras(dockerfile: Path) -> set[str]:
    """The nanoserve extras an image installs: those its requirement list is made for
    (docker/requirements.py) and those its wheel is installed with; one set, or the test fails."""
    text = dockerfile.read_text()
    listed = re.findall(r"requirements\.py pyproject\.toml ([\w ]+?) >", text)
    wheel = re.findall(r"nanoserve-\*\.whl\)\[([\w,]+)\]", text)
    assert len(listed) == len(wheel) == 1, (listed, wheel)
    assert set(listed[0].split()) == set(wheel[0].split(",")), (listed, wheel)
    return set(wheel[0].split(","))


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
