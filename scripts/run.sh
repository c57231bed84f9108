#!/usr/bin/env bash
# The main job: set up a fresh machine (.venv in the repo), then serve worker + frontend on loopback and
# stream one demo reply. Without --model it serves the embedded tiny random Qwen3 (`--model tiny`, built
# on first use; its replies are gibberish). Arguments go to `nanoserve serve`, e.g.
#   bash scripts/run.sh --model /models/Qwen3-0.6B --port 50051
# Stop it with Ctrl-C (or SIGTERM): in-flight requests finish first. Point a client at the address it
# prints: `nanoserve generate --address 127.0.0.1:50051 "Hello"`, or in Python
# `from nanoserve import Client; Client("127.0.0.1:50051").generate("Hello").text`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh all
echo "nanoserve: starting; Ctrl-C stops it. Once it says 'serving', point a client at the printed" \
  "address: nanoserve generate --address HOST:PORT \"Hello\" (or Python: nanoserve.Client)." >&2
exec nanoserve serve --model tiny --demo "Say hello in three languages." "$@"
