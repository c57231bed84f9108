#!/usr/bin/env bash
# Sourced by run.sh and test.sh: creates .venv (Python >= 3.10) and installs nanoserve with the
# extras named in $1 (all | dev). On a machine without CUDA, torch is pinned to the 2.13.0 CPU build:
# an unpinned torch pulls a multi-GB CUDA build.
extras=${1:-all}
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip install -q "torch>=2.11,<2.14"  # the tested range (pyproject.toml's worker extra)
  else
    pip install -q torch==2.13.0
  fi
fi
pip install -q -e ".[${extras}]"
