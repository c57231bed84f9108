"""The two small scripts the images carry or build with: docker/worker_secret.py (the compose
stack's one-shot writer of the worker secret) and docker/requirements.py (the dependency list an
image installs before its wheel, checked against the installed distribution's own metadata)."""

import importlib.util
import re
import stat
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.unit.compose_files import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"docker/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker_secret = load("worker_secret")
requirements = load("requirements")


def test_secret_is_written_once_private_and_random(tmp_path: Path) -> None:
    path = tmp_path / "token"
    assert worker_secret.write_once(path) is True
    secret = path.read_text()
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", secret)  # 256 bits, no newline to strip
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert worker_secret.write_once(path) is False and path.read_text() == secret  # kept
    assert worker_secret.main([str(path)]) == 0 and path.read_text() == secret
    other = tmp_path / "other"
    worker_secret.write_once(other)
    assert other.read_text() != secret
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "token"]  # no temporary left


def test_an_empty_secret_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.touch()
    assert worker_secret.write_once(path) is True and len(path.read_text()) == 43


def test_secret_writer_usage(tmp_path: Path, capsys) -> None:
    assert worker_secret.main([]) == 2
    assert "usage" in capsys.readouterr().err
    assert worker_secret.main([str(tmp_path / "missing-dir" / "token")]) == 1
    assert "cannot write" in capsys.readouterr().err


def requirement_set(lines: list[str]) -> set[tuple[str, str]]:
    parsed = [Requirement(line) for line in lines]
    return {(r.name.lower().replace("_", "-"), str(r.specifier)) for r in parsed}


@pytest.mark.parametrize("extra", ["worker", "frontend", "gateway"])
def test_requirements_match_the_distributions_metadata(extra: str) -> None:
    """What an image installs before its wheel is what `pip install nanoserve[extra]` would."""
    pyproject = requirements.tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = requirements.requirements(pyproject, [extra])
    wanted = []
    for line in metadata.requires("nanoserve") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or marker.evaluate({"extra": extra}):
            requirement.marker = None
            wanted.append(str(requirement))
    assert requirement_set(listed) == requirement_set(wanted)


def test_requirements_expand_extras_that_name_others(capsys) -> None:
    pyproject = requirements.tomllib.loads((ROOT / "pyproject.toml").read_text())
    every = set(requirements.requirements(pyproject, ["all"]))
    for extra in ("frontend", "worker", "tiny", "gateway"):
        assert set(requirements.requirements(pyproject, [extra])) <= every
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        requirements.requirements(pyproject, ["nope"])
    requirements.main([str(ROOT / "pyproject.toml"), "--build"])
    assert capsys.readouterr().out.split() == ["setuptools>=68"]
