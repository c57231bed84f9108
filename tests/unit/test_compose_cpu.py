"""docker-compose.cpu.yml, the stack on a machine without GPUs: merged onto the GPU file (alone or
with docker-compose.scaled.yml) it changes the worker's device and the model (the tiny one unless
NANOSERVE_MODEL_DIR names another), nothing else, and the worker's config on the CPU is valid.
tests/compose checks the same with Compose v2's own merge, against the running stack."""

import os

import pytest

from nanoserve.config import parse_config
from nanoserve.worker.config import WorkerConfig
from tests.unit.compose_files import (
    COMPOSE,
    CPU,
    MISSING,
    RESET,
    SCALED,
    differences,
    load_stack,
)

DEVICE = ("services", "worker", "environment", "NANOSERVE_WORKER_DEVICE")
GPU_REQUEST = ("services", "worker", "deploy", "resources")
MODEL_MOUNTS = {("services", name, "volumes") for name in ("worker", "frontend")}


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, SCALED]], ids=["plain", "scaled"])
def test_cpu_override_changes_only_the_device_and_the_model(files) -> None:
    gpu, cpu = load_stack(*files), load_stack(*files, CPU)
    diff = differences(gpu, cpu)
    assert set(diff) == {DEVICE, GPU_REQUEST} | MODEL_MOUNTS, set(diff)
    assert diff[DEVICE] == ("cuda", "cpu")
    assert diff[GPU_REQUEST][1] is MISSING  # no device request left for Docker to refuse
    for path in MODEL_MOUNTS:
        before, after = diff[path]
        assert (
            before[0] == "./models/Qwen3-0.6B:/model:ro" and after[0] == "./models/tiny:/model:ro"
        )
        assert before[1:] == after[1:]
    # a model named by NANOSERVE_MODEL_DIR (as scripts/compose_cpu.sh does): the device alone
    env = {"NANOSERVE_MODEL_DIR": "/models/tiny"}
    assert set(differences(load_stack(*files, env=env), load_stack(*files, CPU, env=env))) == {
        DEVICE,
        GPU_REQUEST,
    }


def test_scaled_replicas_survive_the_cpu_override() -> None:
    worker = load_stack(COMPOSE, SCALED, CPU, env={"NANOSERVE_WORKERS": "3"})["services"]["worker"]
    assert worker["deploy"] == {"replicas": 3}


def test_cpu_override_resets_rather_than_empties_the_gpu_request() -> None:
    """`resources: !reset {}`: an empty mapping merged onto the GPU file would keep its device
    request (compose merges mappings), so the override must drop the key."""
    text = CPU.read_text()
    assert "resources: !reset {}" in text
    assert load_stack(CPU)["services"]["worker"]["deploy"]["resources"] is RESET


def test_worker_config_on_the_cpu_is_valid(tmp_path, monkeypatch) -> None:
    worker = load_stack(COMPOSE, CPU)["services"]["worker"]
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in worker["environment"].items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("NANOSERVE_WORKER_MODEL", str(tmp_path))
    config = parse_config(WorkerConfig, [])
    assert config.device == "cpu" and config.tensor_parallel_size == 1
