#!/usr/bin/env bash
# The test command: sets up a fresh machine (a .venv in the repo) and runs every test that needs no
# GPU: unit, end-to-end (real processes on 127.0.0.1) and the Triton kernels in interpreter mode.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh dev
if command -v npm >/dev/null 2>&1; then  # the Node.js e2e client, and buf for the proto lint test
  for dir in clients/node protos; do
    if [ -f "$dir/package-lock.json" ]; then
      npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
    fi
  done
fi
# docker-compose validates docker-compose.yml without a docker engine (Debian's package). Installing it
# touches the system, so only when asked (NANOSERVE_APT=1, as .ci/run does on its throwaway machine);
# otherwise the compose test says it skipped.
if ! command -v docker-compose >/dev/null 2>&1; then
  if [ "${NANOSERVE_APT:-0}" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose) >/dev/null 2>&1 \
      || echo "note: docker-compose could not be installed; the compose validation test will skip" >&2
  else
    echo "note: docker-compose is not installed, so the compose validation test will skip" \
      "(NANOSERVE_APT=1 bash scripts/test.sh installs it with apt-get, as root)" >&2
  fi
fi
# One formatter, a linter and a type checker (pyproject.toml [tool.ruff], [tool.mypy]); a finding
# fails the command after the tests ran. NANOSERVE_LINT=0 skips them.
lint_rc=0
if [ "${NANOSERVE_LINT:-1}" != 0 ]; then
  ruff format --check . || { echo "ruff format: run \`ruff format .\`" >&2; lint_rc=1; }
  ruff check . || { echo "ruff check: findings above (\`ruff check --fix .\` mends some)" >&2; lint_rc=1; }
  bash scripts/typecheck.sh --no-error-summary || { echo "mypy: type errors above" >&2; lint_rc=1; }
fi
set +e
python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
if [ "$rc" -eq 0 ] && [ "$lint_rc" -ne 0 ]; then
  exit "$lint_rc"
fi
exit "$rc"
