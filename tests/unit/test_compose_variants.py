"""The compose file's variants: the docker-compose.scaled.yml override (several worker replicas)
and the `#tls ` lines uncommented (worker-link mutual TLS); each builds valid configs."""

import os

import pytest

from nanoserve.config import env_prefix, env_var, parse_config
from tests.unit.compose_files import (
    CERTS_IN_IMAGE,
    COMPOSE,
    CONFIGS,
    ROOT,
    SCALED,
    TLS_LINE,
    compose_v1,
    config_env_names,
    container_env,
    load_compose_tls,
    load_healthcheck,
    load_stack,
    run,
    yaml,
)


def load_scaled(env: dict[str, str] | None = None) -> dict:
    return load_stack(COMPOSE, SCALED, env=env)


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
    probe = {k for k in service["environment"] if k.startswith(load_healthcheck().PROBE)}
    assert set(service["environment"]) - probe <= config_env_names(name)
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
