#!/usr/bin/env bash
# mypy over the `nanoserve` packages as they install (pyproject.toml [tool.mypy]). mypy cannot follow
# setuptools' package-dir mapping, so it reads a link tree laid out like the wheel; the error paths
# are mapped back to the repository's (shared/ = nanoserve/, frontend/ = nanoserve/frontend/, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$PWD/.mypy_cache/tree  # a fixed place, so mypy's cache stays valid between runs
rm -rf "$tree"
mkdir -p "$tree/nanoserve"
for path in shared/*; do
  ln -s "$PWD/$path" "$tree/nanoserve/"
done
for package in frontend worker benchmarks; do
  ln -s "$PWD/$package" "$tree/nanoserve/$package"
done
MYPYPATH="$tree" mypy --config-file pyproject.toml "$@" -p nanoserve 2>&1 \
  | sed -E "s#^[^: ]*/nanoserve/#nanoserve/#; s#^nanoserve/(frontend|worker|benchmarks)/#\1/#; s#^nanoserve/#shared/#"
exit "${PIPESTATUS[0]}"
