"""docker-compose.yml as it ships: docker-compose accepts it; what it says (network, ports, GPUs,
volumes, restart and health checks); its NANOSERVE_* variables build each service's real config."""

import os
import re
import shutil

import pytest

from nanoserve.config import env_prefix, env_var, parse_config
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.worker.config import WorkerConfig
from tests.unit.compose_files import (
    CERTS_IN_IMAGE,
    COMPOSE,
    CONFIGS,
    DOCKERFILES,
    GRPC_SERVICES,
    HEALTHCHECK_IN_IMAGE,
    TLS_LINE,
    WORKER_AUTH_VARS,
    compose_v1,
    config_env_names,
    default,
    image_extras,
    load_compose,
    run,
    seconds,
    yaml,
)


@pytest.fixture(scope="module")
def services() -> dict:
    return load_compose()["services"]


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
    assert frontend["ports"][0] in (  # docker-compose 1.x's spelling, or v2's
        "127.0.0.1:6000:50051/tcp",
        {"host_ip": "127.0.0.1", "published": 6000, "target": 50051},
        {"host_ip": "127.0.0.1", "published": "6000", "target": 50051, "protocol": "tcp"},
    )
    moved = run([*compose_v1(), "config"], NANOSERVE_BIND_ADDRESS="0.0.0.0", **env)
    assert moved.returncode == 0, moved.stderr
    assert yaml.safe_load(moved.stdout)["services"]["gateway"]["ports"] in (
        ["0.0.0.0:8000:8000/tcp"],
        [{"host_ip": "0.0.0.0", "published": 8000, "target": 8000}],
        [{"host_ip": "0.0.0.0", "published": "8000", "target": 8000, "protocol": "tcp"}],
    )


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
    assert [v.split(":")[0] for v in services["frontend"]["volumes"][1:]] == ["worker-auth"]
    moved = load_compose({"NANOSERVE_MODEL_DIR": str(tmp_path)})["services"]
    assert moved["worker"]["volumes"][0] == f"{tmp_path}:/model:ro"


def test_worker_keeps_its_compile_cache_in_a_named_volume(services) -> None:
    """Triton's kernels survive a restart: the worker's cache dir lies in a named volume."""
    worker = services["worker"]
    mounts = dict(v.split(":", 1) for v in worker["volumes"][1:])
    assert set(mounts) == {"compile-cache", "worker-auth"}
    assert "compile-cache" in load_compose()["volumes"]
    cache_dir = worker["environment"]["NANOSERVE_WORKER_COMPILE_CACHE_DIR"]
    assert cache_dir.startswith(mounts["compile-cache"] + "/")
    assert default(WorkerConfig, "compile_cache_dir") == ""  # a local run keeps Triton's default
    dockerfile = DOCKERFILES["worker"].read_text()
    made = re.search(rf"mkdir -p [^\n]*{re.escape(mounts['compile-cache'])}\b", dockerfile)
    assert made  # owned by the user, not root


def test_frontend_is_published_and_waits_for_a_healthy_worker(services) -> None:
    frontend = services["frontend"]
    assert frontend["depends_on"] == {
        "worker-auth": {"condition": "service_completed_successfully"},
        "worker": {"condition": "service_healthy"},
    }
    assert frontend["ports"][0] == "127.0.0.1:50051:50051"
    assert (
        load_compose({"NANOSERVE_FRONTEND_PORT": "8001"})["services"]["frontend"]["ports"][0]
        == "127.0.0.1:8001:50051"
    )
    public = load_compose({"NANOSERVE_BIND_ADDRESS": "0.0.0.0"})["services"]
    assert public["frontend"]["ports"][0] == "0.0.0.0:50051:50051"
    assert public["gateway"]["ports"] == ["0.0.0.0:8000:8000"]


def test_every_published_port_binds_loopback_unless_told_otherwise(services) -> None:
    """Only this host reaches the APIs and the metrics by default; NANOSERVE_BIND_ADDRESS moves
    every published port at once."""
    published = [p for service in services.values() for p in service.get("ports", [])]
    assert len(published) == 3 and all(p.startswith("127.0.0.1:") for p in published)
    moved = load_compose({"NANOSERVE_BIND_ADDRESS": "0.0.0.0"})["services"]
    assert all(p.startswith("0.0.0.0:") for s in moved.values() for p in s.get("ports", []))


def test_frontend_metrics_are_published_and_the_workers_stay_internal(services) -> None:
    """Both services serve /metrics (a metrics_port of 0 is off); only the frontend's reaches the
    host, the worker's only the compose network (a Prometheus beside the services)."""
    worker, frontend = services["worker"], services["frontend"]
    frontend_port = int(frontend["environment"]["NANOSERVE_FRONTEND_METRICS_PORT"])
    worker_port = int(worker["environment"]["NANOSERVE_WORKER_METRICS_PORT"])
    assert frontend_port > 0 and worker_port > 0 and frontend_port != 50051
    assert frontend["ports"] == [
        "127.0.0.1:50051:50051",
        f"127.0.0.1:{frontend_port}:{frontend_port}",
    ]
    moved = load_compose({"NANOSERVE_FRONTEND_METRICS_PORT": "9500"})["services"]["frontend"]
    assert moved["ports"][1] == f"127.0.0.1:9500:{frontend_port}"
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


def test_gateway_is_published_and_waits_for_a_healthy_frontend(services) -> None:
    gateway = services["gateway"]
    assert gateway["depends_on"] == {"frontend": {"condition": "service_healthy"}}
    assert gateway["ports"] == ["127.0.0.1:8000:8000"] and gateway["networks"] == ["nanoserve"]
    assert "volumes" not in gateway  # no tokenizer (the frontend does the text work), no secret
    moved = load_compose({"NANOSERVE_GATEWAY_PORT": "9000"})["services"]["gateway"]
    assert moved["ports"] == ["127.0.0.1:9000:8000"]
    assert image_extras(DOCKERFILES["gateway"]) == {"gateway", "tracing"}


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_environment_names_are_config_fields(services, name: str) -> None:
    fields = config_env_names(name)
    used = set(services[name]["environment"])
    image = set(re.findall(r"\b(NANOSERVE_\w+)=", DOCKERFILES[name].read_text()))
    assert used | image <= fields, f"not {CONFIGS[name].__name__} fields: {(used | image) - fields}"


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


def test_tls_lines_are_off_by_default_and_complete(services) -> None:
    assert len(TLS_LINE.findall(COMPOSE.read_text())) >= 10
    for name in ("worker", "frontend"):
        assert not any("TLS" in key for key in services[name]["environment"])
        assert not any(CERTS_IN_IMAGE in volume for volume in services[name]["volumes"])


def test_workers_and_the_frontend_share_a_secret_written_before_they_start(services) -> None:
    """No unauthenticated worker: the one-shot `worker-auth` writes the secret into a volume that
    the worker (requires it) and the frontend (sends it) mount read-only and wait for; nothing else
    gets it, and a plain `docker compose up` needs nothing from the user."""
    auth = services["worker-auth"]
    ((volume, target),) = [m.split(":") for m in auth["volumes"]]
    assert volume in load_compose()["volumes"]
    assert auth["network_mode"] == "none" and auth["restart"] == "no" and "ports" not in auth
    assert auth["image"] == services["frontend"]["image"] and "build" in services["frontend"]
    *command, token = auth["entrypoint"]
    assert command == ["python", "/opt/nanoserve/worker_secret.py"]
    assert token.startswith(target + "/")
    for name in ("worker", "frontend"):
        service = services[name]
        assert f"{volume}:{target}:ro" in service["volumes"]
        assert service["depends_on"]["worker-auth"] == {
            "condition": "service_completed_successfully"
        }
        assert service["environment"][WORKER_AUTH_VARS[name]] == token
    assert volume not in str(services["gateway"])
    # the image the one-shot runs has the script, and the mount point made by its user, so that a
    # fresh volume takes that owner and the user can write the secret
    steps = DOCKERFILES["frontend"].read_text()
    assert f"COPY docker/worker_secret.py {command[1]}" in steps
    assert f"RUN mkdir -p {target}" in steps.split("USER 10001:10001", 1)[1]


def test_health_probe_interval_is_configurable(services) -> None:
    """Every service is healthy (and the next one starts) at its first probe after it is ready:
    NANOSERVE_HEALTH_INTERVAL shortens the wait, e.g. for a test run of the stack."""
    assert {s["healthcheck"]["interval"] for s in services.values() if "healthcheck" in s} == {
        "10s"
    }
    fast = load_compose({"NANOSERVE_HEALTH_INTERVAL": "1s"})["services"]
    assert all(fast[name]["healthcheck"]["interval"] == "1s" for name in CONFIGS)
