#!/usr/bin/env bash
# The test command: sets up a fresh machine (a .venv in the repo) and runs every test that needs no
# GPU: unit, end-to-end (real processes on 127.0.0.1) and the Triton kernels in interpreter mode.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh dev
if command -v npm >/dev/null 2>&1; then  # the Node client that an e2e test runs
  npm ci --prefix clients/node --no-audit --no-fund --loglevel=error >/dev/null
fi
set +e
python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
