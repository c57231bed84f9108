"""Compose v2's own merge of the files as the stack runs them (`docker compose config`): the CPU
override changes the worker's device and drops its GPU request, nothing else, alone and with
docker-compose.scaled.yml, whose replicas stay (tests/unit/test_compose_cpu.py checks the same
with PyYAML, where no Compose v2 is installed)."""

import json

import pytest

from tests.compose.stack import GPU, PLAIN, SCALED, Stack
from tests.unit.compose_files import MISSING, differences

DEVICE = ("services", "worker", "environment", "NANOSERVE_WORKER_DEVICE")
GPU_REQUEST = ("services", "worker", "deploy", "resources", "reservations")


def resolved(files: tuple[str, ...]) -> dict:
    return json.loads(Stack(files).compose("config", "--format", "json", timeout=60))


@pytest.mark.parametrize(
    ("gpu_files", "cpu_files"),
    [(GPU, PLAIN), (("docker-compose.yml", "docker-compose.scaled.yml"), SCALED)],
    ids=["plain", "scaled"],
)
def test_cpu_files_differ_from_the_gpu_files_in_the_device_alone(gpu_files, cpu_files) -> None:
    """With the model named (NANOSERVE_MODEL_DIR: the tiny one) the device is all that changes."""
    gpu, cpu = resolved(gpu_files), resolved(cpu_files)
    diff = differences(gpu, cpu)
    assert set(diff) == {DEVICE, GPU_REQUEST}, sorted(diff)
    assert diff[DEVICE] == ("cuda", "cpu")
    (device,) = diff[GPU_REQUEST][0]["devices"]
    assert device["driver"] == "nvidia" and diff[GPU_REQUEST][1] is MISSING
    if "docker-compose.scaled.yml" in cpu_files:
        assert cpu["services"]["worker"]["deploy"]["replicas"] == 2
