"""The live compose tests run only inside scripts/compose_cpu.sh (`bash scripts/compose_cpu.sh
test`), which builds the images, starts a Docker daemon and sets NANOSERVE_COMPOSE_LIVE=1 with the
ports and the model. Anywhere else (a plain `pytest`, scripts/test.sh) they are not collected: a
developer's test run needs no Docker, and run directly pytest finds no tests and fails."""

import os

import pytest

from tests.compose.stack import PLAIN, Stack

if os.environ.get("NANOSERVE_COMPOSE_LIVE") != "1":
    collect_ignore_glob = ["test_*.py"]


def published_port(name: str) -> int:
    """A host port scripts/compose_cpu.sh picked (free loopback ports, never 50051)."""
    return int(os.environ[name])


@pytest.fixture(scope="module")
def plain() -> Stack:
    """docker-compose.yml + docker-compose.cpu.yml, started healthy; removed (with its volumes)
    after the module, whatever its tests left."""
    stack = Stack(PLAIN)
    stack.up()
    yield stack
    stack.down()
