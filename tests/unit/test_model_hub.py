"""`--model ORG/NAME`: a Hugging Face hub id resolves to its snapshot in the local Hugging Face cache,
offline (HF_HUB_OFFLINE=1); an uncached id offline is refused in one line. No network is used: the
cache is populated here by hand, in the layout huggingface_hub writes.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_env(tmp_path: Path, tiny_model_dir: Path) -> dict[str, str]:
    """A Hugging Face cache holding nanoserve-test/tiny-qwen3 at `main`, and an offline env."""
    repo = tmp_path / "hub" / "models--nanoserve-test--tiny-qwen3"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(tiny_model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NANOSERVE_"))}
    return env | {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_hub_id_resolves_from_the_cache_offline(hf_env: dict[str, str]) -> None:
    code = (
        "from nanoserve.model_files import check_model_dir, resolve_model_dir\n"
        "path = resolve_model_dir('nanoserve-test/tiny-qwen3')\n"
        "check_model_dir(path)\n"
        "print(path)\n"
    )
    done = python(code, hf_env)
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == COMMIT and (path / "model.safetensors").is_file()
    assert Path(hf_env["HF_HUB_CACHE"]) in path.parents


def test_revision_must_be_cached_offline(hf_env: dict[str, str]) -> None:
    code = (
        "from nanoserve.model_files import resolve_model_dir\n"
        "resolve_model_dir('nanoserve-test/tiny-qwen3', 'v2')\n"
    )
    done = python(code, hf_env)
    assert done.returncode == 1 and "tiny-qwen3@v2: not in the Hugging Face cache" in done.stderr


def test_uncached_hub_id_offline_is_one_line(hf_env: dict[str, str]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanoserve.worker",
            "--model",
            "nanoserve-test/missing",
            "--port",
            "0",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=hf_env,
    )
    errors = [line for line in done.stdout.splitlines() if " ERROR " in line] + [
        line for line in done.stderr.splitlines() if line
    ]
    assert done.returncode == 1 and len(errors) == 1, done.stdout + done.stderr
    assert "nanoserve-test/missing: not in the Hugging Face cache and offline" in errors[0]


def test_serve_accepts_a_hub_id(hf_env: dict[str, str]) -> None:
    """`nanoserve serve --model ORG/NAME` checks the cached snapshot, then hands the id on."""
    code = (
        "from nanoserve import cli\n"
        "_, worker, frontend = cli.serve_argvs(['--model', 'nanoserve-test/tiny-qwen3', "
        "'--port', '0', '--revision', 'main'])\n"
        "print(worker[:2], frontend[:2], worker[-2:], frontend[-2:])\n"
    )
    done = python(code, hf_env)
    assert done.returncode == 0, done.stderr
    model = "['--model', 'nanoserve-test/tiny-qwen3']"
    revision = "['--revision', 'main']"
    assert done.stdout.strip() == f"{model} {model} {revision} {revision}"
