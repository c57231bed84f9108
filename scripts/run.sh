#!/usr/bin/env bash
# The main job: set up a fresh machine (.venv in the repo), then serve worker + frontend on loopback and
# stream one demo reply. Without --model it serves the embedded tiny random Qwen3 (built on first use).
# Arguments go to `nanoserve serve`, e.g. `bash scripts/run.sh --model /models/Qwen3-0.6B --port 50051`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh all
exec nanoserve serve --demo "Say hello in three languages." "$@"
