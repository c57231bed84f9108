#!/usr/bin/env bash
# The docker-compose stack for real on a CPU machine: installs the Docker engine when missing, makes
# the base image without a registry (Debian's archive), builds the three images from a host
# wheelhouse, starts docker-compose.yml + docker-compose.cpu.yml with the tiny model on free
# loopback ports, and on exit (failed or not) tears it all down: containers, network, volumes, the
# daemon it started and the host networking that daemon changed.
#
#   bash scripts/compose_cpu.sh        # serve until Ctrl-C (prints the addresses)
#   bash scripts/compose_cpu.sh test   # the live compose tests, tests/compose (CI: .ci/run)
#
# Needs root on Debian 12 (apt-get, dockerd, debootstrap) and the network to Debian's archive and
# the package index (the wheelhouse). The images stay in docker's store for the next run (their
# base too: `docker image rm local/python:3.11-bookworm` makes it anew, with Debian's updates); with
# no daemon running, `rm -rf /var/lib/docker` drops them all. Extra arguments of `test` go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-up}
[ "$#" -gt 0 ] && shift
case $mode in up | test) ;; *)
  echo "usage: bash scripts/compose_cpu.sh [up|test [PYTEST ARGS]]" >&2
  exit 2
  ;;
esac

# shellcheck source=scripts/compose/engine.sh
source scripts/compose/engine.sh
# shellcheck source=scripts/compose/images.sh
source scripts/compose/images.sh

export COMPOSE_PROJECT_NAME=nanoserve-cpu
# every file any step uses (the scaled override adds no service): `down` then finds everything
ALL_FILES=(-f docker-compose.yml -f docker-compose.scaled.yml -f docker-compose.cpu.yml)
WAITER=  # `up` mode's sleep, which teardown ends
compose() { docker compose -f docker-compose.yml -f docker-compose.cpu.yml "$@"; }

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  # serving until Ctrl-C (or a TERM) is how `up` ends: not a failure
  if [ "$mode" = up ] && [ -n "$WAITER" ] && { [ "$rc" = 130 ] || [ "$rc" = 143 ]; }; then
    rc=0
  fi
  if docker info >/dev/null 2>&1; then
    say "tearing down: containers, network and volumes of project $COMPOSE_PROJECT_NAME"
    docker compose "${ALL_FILES[@]}" down --volumes --remove-orphans --timeout 45 >/dev/null 2>&1
  fi
  [ -n "$WAITER" ] && kill "$WAITER" 2>/dev/null
  [ -n "$ROOTFS" ] && remove_rootfs "$ROOTFS"
  engine_stop "$rc"
  say "done in $((SECONDS))s (exit $rc)"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# the project's venv: nanoserve for the tiny model and the tests, its pip for the wheelhouse
if [ ! -x .venv/bin/python ]; then
  # shellcheck source=scripts/setup.sh
  source scripts/setup.sh dev
fi
# shellcheck disable=SC1091
source .venv/bin/activate

engine_install
engine_start
base_image
wheelhouse
build_images
say "images ready after ${SECONDS}s: $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  'nanoserve-*' | sort | paste -sd ' ')"

# the tiny random Qwen3, readable by the containers' user (uid 10001)
model=.cache/compose/tiny-model
if [ ! -f "$model/config.json" ]; then
  nanoserve make-tiny-model "$model" >/dev/null
fi
chmod -R a+rX .cache/compose
export NANOSERVE_MODEL_DIR=$PWD/$model
# published on loopback only, on ports free now (never the tests' 50051); health probed every
# second, so that each service counts as healthy about a second after it is ready
read -r NANOSERVE_FRONTEND_PORT NANOSERVE_FRONTEND_METRICS_PORT NANOSERVE_GATEWAY_PORT < <(
  python -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))'
)
export NANOSERVE_FRONTEND_PORT NANOSERVE_FRONTEND_METRICS_PORT NANOSERVE_GATEWAY_PORT
export NANOSERVE_BIND_ADDRESS=127.0.0.1 NANOSERVE_HEALTH_INTERVAL=1s

if [ "$mode" = test ]; then
  NANOSERVE_COMPOSE_LIVE=1 python -m pytest -q -p no:cacheprovider tests/compose "$@"
  exit 0
fi

start=$SECONDS
if ! compose up --detach --wait --wait-timeout 300; then
  compose ps --all >&2
  compose logs --tail 30 >&2
  die "the stack did not become healthy"
fi
say "healthy in $((SECONDS - start))s (${SECONDS}s in all); Ctrl-C stops it and tears it down"
cat <<EOF
gRPC API       nanoserve generate --address 127.0.0.1:$NANOSERVE_FRONTEND_PORT "Hello"
OpenAI API     http://127.0.0.1:$NANOSERVE_GATEWAY_PORT/v1   (model "model")
metrics        http://127.0.0.1:$NANOSERVE_FRONTEND_METRICS_PORT/metrics
compose        COMPOSE_PROJECT_NAME=$COMPOSE_PROJECT_NAME docker compose -f docker-compose.yml -f docker-compose.cpu.yml ps
EOF
sleep infinity &
WAITER=$!
wait "$WAITER"
