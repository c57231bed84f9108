"""deploy/kubernetes/nanoserve.yaml, read structurally: workers behind a headless Service that the
frontends' worker address names, frontends behind a Service that the gateways' frontend address
names, probes on gRPC health (the gateway's on its HTTP /health), and every NANOSERVE_* variable a
config field that builds a valid config."""

import dataclasses
import os
from pathlib import Path

import pytest

from nanoserve.config import env_prefix, env_var, parse_config
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.worker.config import WorkerConfig

yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifests (pip install pyyaml)")

MANIFEST = Path(__file__).resolve().parents[2] / "deploy/kubernetes/nanoserve.yaml"
CONFIGS: dict[str, type] = {"worker": WorkerConfig, "frontend": FrontendConfig}
SERVICES = {"worker": "nanoserve.v1.WorkerService", "frontend": "nanoserve.v1.FrontendService"}


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    found = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(found) == len(docs), "duplicate kind/name"
    return found


def container(objects: dict, name: str) -> dict:
    (c,) = objects["Deployment", f"nanoserve-{name}"]["spec"]["template"]["spec"]["containers"]
    return c


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"]}


def build(name: str, c: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env(c).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(env_var("model", env_prefix(CONFIGS[name])), str(tmp_path))
    return parse_config(CONFIGS[name], [])


@pytest.mark.parametrize("name", ["worker", "frontend", "gateway"])
def test_services_select_their_pods(objects, name: str) -> None:
    deployment = objects["Deployment", f"nanoserve-{name}"]
    service = objects["Service", f"nanoserve-{name}"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    named = {p["name"]: p["containerPort"] for p in container(objects, name)["ports"]}
    assert port["targetPort"] in named and named[port["targetPort"]] == port["port"]


def test_workers_are_behind_a_headless_service_the_frontends_name(
    objects, tmp_path, monkeypatch
) -> None:
    headless = objects["Service", "nanoserve-worker"]
    assert headless["spec"]["clusterIP"] == "None"  # DNS answers with each worker pod
    assert "clusterIP" not in objects["Service", "nanoserve-frontend"]["spec"]
    worker = build("worker", container(objects, "worker"), tmp_path, monkeypatch)
    frontend = build("frontend", container(objects, "frontend"), tmp_path, monkeypatch)
    host, port = frontend.worker_address.rsplit(":", 1)
    assert host == "nanoserve-worker" and int(port) == worker.port
    assert headless["spec"]["ports"][0]["port"] == worker.port
    assert objects["Deployment", "nanoserve-worker"]["spec"]["replicas"] >= 2
    assert objects["Deployment", "nanoserve-frontend"]["spec"]["replicas"] >= 2
    assert 0 < frontend.worker_resolve_interval_s <= 10


@pytest.mark.parametrize("name", ["worker", "frontend"])
def test_environment_is_config_fields_and_probes_use_grpc_health(
    objects, name: str, tmp_path, monkeypatch
) -> None:
    c = container(objects, name)
    cls = CONFIGS[name]
    fields = {env_var(f.name, env_prefix(cls)) for f in dataclasses.fields(cls)}
    assert set(env(c)) <= fields, set(env(c)) - fields
    config = build(name, c, tmp_path, monkeypatch)
    assert config.host == "0.0.0.0"
    probe = c["readinessProbe"]["grpc"]
    assert (probe["port"], probe["service"]) == (config.port, SERVICES[name])
    pod = objects["Deployment", f"nanoserve-{name}"]["spec"]["template"]["spec"]
    assert config.grace_period_s < pod["terminationGracePeriodSeconds"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["model"]["mountPath"] == "/model" and mounts["model"]["readOnly"] is True


def test_worker_gets_gpus_for_its_ranks(objects, tmp_path, monkeypatch) -> None:
    c = container(objects, "worker")
    config = build("worker", c, tmp_path, monkeypatch)
    assert config.device == "cuda"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == config.tensor_parallel_size


def test_gateways_speak_to_the_frontends_service_and_probe_their_health(
    objects, monkeypatch
) -> None:
    c = container(objects, "gateway")
    fields = {env_var(f.name, env_prefix(GatewayConfig)) for f in dataclasses.fields(GatewayConfig)}
    assert set(env(c)) <= fields, set(env(c)) - fields
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in env(c).items():
        monkeypatch.setenv(key, value)
    config = parse_config(GatewayConfig, [])
    frontend_service = objects["Service", "nanoserve-frontend"]["spec"]["ports"][0]["port"]
    assert config.frontend_address == f"nanoserve-frontend:{frontend_service}"
    assert config.host == "0.0.0.0" and config.metrics_port
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named == {"http": config.port, "metrics": config.metrics_port}
    probe = c["readinessProbe"]["httpGet"]
    assert (probe["path"], named[probe["port"]]) == ("/health", config.port)
    pod = objects["Deployment", "nanoserve-gateway"]["spec"]["template"]["spec"]
    assert config.grace_period_s < pod["terminationGracePeriodSeconds"]


def test_workers_need_the_link_token_and_only_frontends_reach_them(
    objects, tmp_path, monkeypatch
) -> None:
    """Issue 32: no unauthenticated worker on the cluster network."""
    secret_file = tmp_path / "token"
    secret_file.write_text("t\n")
    worker_env = env(container(objects, "worker"))
    frontend_env = env(container(objects, "frontend"))
    token = worker_env["NANOSERVE_WORKER_AUTH_TOKEN_FILE"]
    assert frontend_env["NANOSERVE_FRONTEND_WORKER_AUTH_TOKEN_FILE"] == token
    assert frontend_env["NANOSERVE_FRONTEND_API_KEYS_FILE"]
    for name in ("worker", "frontend"):  # the token's directory is the Secret's mount
        mounts = {m["mountPath"]: m["name"] for m in container(objects, name)["volumeMounts"]}
        assert mounts[str(Path(token).parent)] == "worker-token"
        pod = objects["Deployment", f"nanoserve-{name}"]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["worker-token"]["secret"]["secretName"] == "nanoserve-worker-token"
    worker = build("worker", container(objects, "worker"), tmp_path, monkeypatch)
    assert worker.host == "0.0.0.0" and worker.auth_token_file == token
    policy = objects["NetworkPolicy", "nanoserve-worker"]["spec"]
    worker_labels = objects["Deployment", "nanoserve-worker"]["spec"]["template"]["metadata"]
    assert policy["podSelector"]["matchLabels"].items() <= worker_labels["labels"].items()
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    frontend_labels = objects["Deployment", "nanoserve-frontend"]["spec"]["template"]["metadata"]
    assert source["podSelector"]["matchLabels"].items() <= frontend_labels["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
