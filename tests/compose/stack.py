"""The compose CLI as the live tests use it: one project (COMPOSE_PROJECT_NAME, set by
scripts/compose_cpu.sh with the ports and the model), its `-f` files, and what Docker says about its
containers, networks and volumes. Every call has a timeout, so a hang fails the test."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ("docker-compose.yml", "docker-compose.cpu.yml")
SCALED = ("docker-compose.yml", "docker-compose.scaled.yml", "docker-compose.cpu.yml")
GPU = ("docker-compose.yml",)
UP_TIMEOUT_S = 180  # healthy in ~10 s here; a worker that never serves fails after this
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    done = subprocess.run(
        ["docker", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class Stack:
    files: tuple[str, ...]
    project: str = os.environ.get("COMPOSE_PROJECT_NAME", "nanoserve-cpu")

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        argv = ["compose", "-p", self.project]
        for path in self.files:
            argv += ["-f", path]
        done = subprocess.run(
            ["docker", *argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)}: exit {done.returncode}\n"
                f"{done.stderr[-4000:]}\n{self.logs()}"
            )
        return done.stdout

    def up(self, *args: str) -> None:
        """Starts (or scales) the stack from the images already built, healthy or a failure."""
        wait = ("--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT_S))
        self.compose("up", *wait, "--no-build", "--pull", "never", *args, timeout=UP_TIMEOUT_S + 60)

    def stop(self) -> None:
        """SIGTERM to every container (dependents first); the services drain, then exit."""
        self.compose("stop", timeout=180)

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", timeout=180)

    def logs(self, service: str = "", tail: int = 40) -> str:
        args = ["logs", "--no-color", "--tail", str(tail), *([service] if service else [])]
        return self.compose(*args, check=False, timeout=60)

    def containers(self, service: str = "") -> list[dict]:
        """`docker inspect` of the project's containers (stopped ones too), by service name."""
        filters = ["--filter", f"label={PROJECT_LABEL}={self.project}"]
        if service:
            filters += ["--filter", f"label={SERVICE_LABEL}={service}"]
        ids = docker("ps", "--all", "--quiet", *filters).split()
        found = json.loads(docker("inspect", *ids)) if ids else []
        return sorted(found, key=lambda c: c["Name"])

    def exec_python(self, container: dict, code: str) -> str:
        """Runs `python -c code` inside a running container (as its user) and returns stdout."""
        return docker("exec", container["Id"], "python", "-c", code, timeout=60)

    def metrics(self, container: dict, port: int) -> str:
        """A /metrics page read from inside the container: ports that are not published."""
        code = (
            "import urllib.request;"
            f"print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=10)"
            ".read().decode())"
        )
        return self.exec_python(container, code)


def service_of(container: dict) -> str:
    return container["Config"]["Labels"][SERVICE_LABEL]


def leftovers(project: str) -> dict[str, list[str]]:
    """What Docker still holds of a project: its containers, networks and volumes, by name."""
    label = f"label={PROJECT_LABEL}={project}"
    return {
        "containers": docker("ps", "--all", "--filter", label, "--format", "{{.Names}}").split(),
        "networks": docker("network", "ls", "--filter", label, "--format", "{{.Name}}").split(),
        "volumes": docker("volume", "ls", "--filter", label, "--format", "{{.Name}}").split(),
    }
