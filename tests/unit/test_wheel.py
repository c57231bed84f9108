"""The distribution: a wheel built from the sources holds only the `nanoserve` namespace (with the
.proto files and py.typed), and installed into a fresh venv without torch it serves `from nanoserve
import Client` and the CLI, also from a directory that holds its own `worker` and `shared` packages.
"""

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and a venv: ~15 s on a busy machine

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "shared",
    "frontend",
    "worker",
    "benchmarks",
    "protos/nanoserve",
)
# What a client-only install needs, linked from this interpreter (no network, no torch).
CLIENT_DEPS = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google",
    "numpy",
    "numpy.libs",
    "typing_extensions.py",
)


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kwargs)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources, as from a clean clone (the checkout stays as is)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(src),
        ]
    )
    (found,) = dist.glob("nanoserve-*.whl")
    return found


@pytest.fixture(scope="module")
def client_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (no system site-packages) with the wheel installed --no-deps, grpc and protobuf
    reachable through a .pth file, and no torch, tokenizers or safetensors."""
    home = tmp_path_factory.mktemp("venv")
    # pip >= 22.3 installs into another interpreter (--python): no pip inside the venv needed.
    outer_pip_ok = tuple(int(x) for x in pip_version().split(".")[:2]) >= (22, 3)
    venv.create(home, with_pip=not outer_pip_ok, symlinks=True)
    python = home / "bin" / "python"
    pip = (
        [sys.executable, "-m", "pip", "--python", str(python)]
        if outer_pip_ok
        else [str(python), "-m", "pip"]
    )
    run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)])
    deps = home / "client-deps"
    deps.mkdir()
    # every site-packages on the path: a venv may layer its packages over a base one's (.pth)
    sites = [Path(p) for p in sys.path if p.endswith("site-packages")]
    for name in CLIENT_DEPS:
        found = next((site / name for site in sites if (site / name).exists()), None)
        if found is not None:
            (deps / name).symlink_to(found)
    (site_of(python) / "client_deps.pth").write_text(f"{deps}\n")
    return home


def pip_version() -> str:
    from pip import __version__

    return __version__


def site_of(python: Path) -> Path:
    out = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(out.stdout.strip())


def test_wheel_holds_only_the_nanoserve_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {
        "nanoserve",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }, tops
    assert "nanoserve/py.typed" in names
    protos = {n for n in names if n.endswith(".proto")}
    assert protos == {
        f"nanoserve/proto/nanoserve/v1/{p}.proto"
        for p in ("common", "frontend_service", "worker_service")
    }
    assert "nanoserve/proto/v1/frontend_service_pb2.py" in names
    assert "nanoserve/tiny/model.py" in names and "nanoserve/worker/__main__.py" in names
    assert "nanoserve/frontend/gateway/__main__.py" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith("nanoserve/tests")]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "nanoserve = nanoserve.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_client_imports_without_torch(client_venv: Path) -> None:
    python = client_venv / "bin" / "python"
    code = (
        "import importlib.util as u, sys\n"
        "assert u.find_spec('torch') is None and u.find_spec('tokenizers') is None\n"
        "from nanoserve import AsyncClient, Client, ServiceError\n"
        "assert 'torch' not in sys.modules\n"
        "print(Client.__module__)\n"
    )
    assert run([str(python), "-c", code]).stdout.strip() == "nanoserve.client"


def test_cli_runs_from_a_directory_with_its_own_worker_and_shared(
    client_venv: Path, tmp_path: Path
) -> None:
    """`worker`, `shared`, `frontend` in the working directory are the user's, never ours."""
    for package in ("worker", "shared", "frontend"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise SystemExit('wrong package')\n")
        (tmp_path / package / "__main__.py").write_text("raise SystemExit('wrong package')\n")
    python = client_venv / "bin" / "python"
    help_text = run([str(python), "-m", "nanoserve.worker", "--help"], cwd=tmp_path).stdout
    assert help_text.startswith("usage: python -m nanoserve.worker") and "--model" in help_text
    script = client_venv / "bin" / "nanoserve"
    assert run([str(script), "worker", "--help"], cwd=tmp_path).stdout.startswith(
        "usage: nanoserve worker"
    )
    assert run([str(script), "--version"], cwd=tmp_path).stdout.startswith("nanoserve ")


def test_client_only_install_refuses_serve_in_one_line(client_venv: Path, tmp_path: Path) -> None:
    script = client_venv / "bin" / "nanoserve"
    done = subprocess.run(
        [str(script), "serve", "--port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "pip install 'nanoserve[all]'" in done.stderr, (
        done.stderr
    )
    assert "Traceback" not in done.stderr
