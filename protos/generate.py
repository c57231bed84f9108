"""Regenerates the committed Python stubs in shared/proto/v1/ (package nanoserve.proto.v1) from protos/nanoserve/v1/*.proto.

Usage: `python protos/generate.py [OUTDIR]` (default: shared/proto). tests/unit/test_protos.py
runs it into a temporary directory and compares the bytes with the committed stubs.
"""

import re
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIR = Path("nanoserve", "v1")


def generate(outdir: Path) -> list[Path]:
    """Runs protoc into `outdir`, makes the stubs' imports relative; returns the written files."""
    outdir.mkdir(parents=True, exist_ok=True)
    found = PROTO_ROOT.glob("nanoserve/v1/*.proto")
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in found)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={outdir}",
        f"--grpc_python_out={outdir}",
        f"--pyi_out={outdir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    # protoc writes `from nanoserve.v1 import x_pb2`, which only works with outdir on sys.path
    # (grpc/grpc#29390); the stubs live in the `nanoserve.proto.v1` package: import relatively.
    absolute_import = re.compile(r"^from nanoserve\.v1 import", re.MULTILINE)
    target = outdir / "v1"
    target.mkdir(exist_ok=True)
    files = []
    for path in sorted((outdir / PACKAGE_DIR).iterdir()):
        if path.suffix in (".py", ".pyi"):
            moved = target / path.name
            moved.write_text(absolute_import.sub("from . import", path.read_text()))
            path.unlink()
            files.append(moved)
    (outdir / PACKAGE_DIR).rmdir()
    (outdir / "nanoserve").rmdir()
    for package in (outdir, target):
        init = package / "__init__.py"
        init.write_text("")
        files.append(init)
    return sorted(files)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "shared" / "proto"
    for path in generate(target):
        print(path)
