"""The package's import graph, read from the source: folders are floors (the README's process boxes,
top first), a module imports only its own floor and those below it (lazy imports included), the
frontend and the worker never import each other, and module-level imports form no circle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"shared": "nanoserve", "worker": "nanoserve.worker", "frontend": "nanoserve.frontend"}

# top floor first; `x.*` is every module under package x, a bare name that one module
FLOORS = [
    {
        "nanoserve",
        "nanoserve.__main__",
        "nanoserve.cli.*",
    },  # the facade and the `nanoserve` command
    {"nanoserve.frontend.gateway.*"},  # the OpenAI gateway: its own process, a frontend client
    {"nanoserve.frontend.*"},  # the frontend's service: servicer, server, request, metrics, logs
    {"nanoserve.frontend.chat.*", "nanoserve.frontend.workers.*", "nanoserve.frontend.text.*"},
    {"nanoserve.frontend.config", "nanoserve.frontend.admission"},
    {"nanoserve.worker", "nanoserve.worker.__main__", "nanoserve.worker.llm"},
    {"nanoserve.worker.service.*"},  # the worker's gRPC process
    {"nanoserve.worker.core.*"},  # its engine core process
    {"nanoserve.worker.tp.*"},  # the tensor-parallel ranks
    {"nanoserve.worker.runner.*"},  # one step on the device
    {"nanoserve.worker.model.*"},
    {"nanoserve.worker.layers.*"},
    {"nanoserve.worker.kernels.*"},
    {"nanoserve.worker.config", "nanoserve.worker.sequence"},  # what every worker floor reads
    {"nanoserve.*"},  # shared's ground floor: never a service's module
]


def module_name(path: Path) -> str:
    top, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[top], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            if "proto" not in path.relative_to(ROOT).parts:
                found[module_name(path)] = path
    return found


def floor(name: str) -> int:
    """The floor of a module: the FLOORS entry that names it, else the longest package holding it."""
    best, best_len = None, -1
    for i, entries in enumerate(FLOORS):
        for entry in entries:
            package = entry.removesuffix(".*")
            if name == entry:
                return i
            if (
                entry != package
                and (name + ".").startswith(package + ".")
                and len(package) > best_len
            ):
                best, best_len = i, len(package)
    assert best is not None, f"{name} is on no floor: add it to FLOORS"
    return best


def imports(path: Path, known: dict[str, Path], top_level_only: bool) -> set[str]:
    """The package's modules `path` imports (`from pkg import module` names the module)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module in known:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            found |= subs or {node.module}
    return found


def test_no_module_imports_a_floor_above_its_own() -> None:
    known = modules()
    upward = []
    for name, path in known.items():
        for target in imports(path, known, top_level_only=False):
            if floor(target) < floor(name):
                upward.append(f"{name} -> {target}")
    assert not upward, upward


def test_the_frontend_and_the_worker_never_import_each_other() -> None:
    known = modules()
    crossing = []
    for name, path in known.items():
        for side, other in (("frontend", "worker"), ("worker", "frontend")):
            if name.startswith(f"nanoserve.{side}"):
                crossing += [
                    f"{name} -> {t}"
                    for t in imports(path, known, top_level_only=False)
                    if t.startswith(f"nanoserve.{other}")
                ]
    assert not crossing, crossing


def test_module_level_imports_form_no_circle() -> None:
    known = modules()
    graph = {name: imports(path, known, top_level_only=True) for name, path in known.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            assert state.get(target) != 1, " -> ".join([*path, name, target])
            if target not in state:
                visit(target, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_module_has_a_floor() -> None:
    for name in modules():
        floor(name)
