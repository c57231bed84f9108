"""The requirement lines an image installs before the nanoserve wheel, read from pyproject.toml: the
Dockerfiles install them in a layer of their own (a source change then reinstalls only the wheel),
and scripts/compose_cpu.sh downloads them into the host's wheelhouse.

usage: requirements.py PYPROJECT EXTRA...   the project's dependencies and those of each extra
       requirements.py PYPROJECT --build    the build backend's (`[build-system] requires`)
One requirement a line, sorted, no duplicates. Python >= 3.11 (tomllib), as every image base has.
"""

import sys
from pathlib import Path

import tomllib

SELF = "nanoserve["  # an extra that names others (`all`), expanded here


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The dependencies plus every named extra's, with `nanoserve[a,b]` entries expanded."""
    project = pyproject["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    lines = set(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"requirements.py: pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for line in optional[extra]:
            if line.startswith(SELF):
                todo.extend(line[len(SELF) :].rstrip("]").split(","))
            else:
                lines.add(line)
    return sorted(lines)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    pyproject = tomllib.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if argv[1:] == ["--build"]:
        lines = sorted(pyproject["build-system"]["requires"])
    else:
        lines = requirements(pyproject, argv[1:])
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
