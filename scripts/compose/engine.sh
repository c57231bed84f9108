# shellcheck shell=bash
# Sourced by scripts/compose_cpu.sh: the Docker engine under the compose stack. Installs it when
# missing (Debian's docker.io; Compose v2 and buildx as CLI plugins from Debian 13, as Debian 12 has
# Compose v1 only), starts a daemon unless one runs, and on teardown stops the daemon it started
# and puts the host's networking back as it found it: dockerd turns on IP forwarding, sets the
# FORWARD policy to DROP, adds NAT rules and bridges, and leaves all of them behind when it stops.

ENGINE_STATE=/run/nanoserve-compose  # this script's daemon: pid, log, the host's networking before it
ENGINE_OWNED=0                       # 1 once this run started dockerd (then teardown stops it)
COMPOSE_MIN=2.18                     # `!reset` in docker-compose.cpu.yml
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
NET_SYSCTLS=(net.ipv4.ip_forward net.ipv6.conf.all.forwarding
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)

say() { echo "compose_cpu [${SECONDS}s]: $*" >&2; }
die() {
  say "error: $*"
  exit 1
}

# apt-get install without starting services: a fresh machine without policy-rc.d would otherwise
# start a docker daemon from the package's init script, one this script does not own.
apt_install() {
  local guard=/usr/sbin/policy-rc.d made=0 rc=0 log
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "installing $* needs root and apt-get (Debian 12); install them and run again"
  fi
  if [ ! -e "$guard" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod 0755 "$guard" && made=1
  fi
  say "apt-get install $*"
  log=$(mktemp)
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "$@"; } >"$log" 2>&1 || rc=$?
  [ "$made" = 1 ] && rm -f "$guard"
  [ "$rc" = 0 ] || { tail -n 30 "$log" >&2; die "apt-get install $* failed (exit $rc)"; }
  rm -f "$log"
}

compose_version_ok() {
  local version
  version=$(docker compose version --short 2>/dev/null) || return 1
  version=${version#v}
  [ "$(printf '%s\n' "$COMPOSE_MIN" "${version%%-*}" | sort -V | head -n1)" = "$COMPOSE_MIN" ]
}

# Compose v2 and buildx from Debian 13's packages, unpacked as CLI plugins only: Go binaries that
# need glibc >= 2.34 (Debian 12 has 2.36). Installing the docker-compose package instead would put
# v2 on PATH as `docker-compose` too and break the tests that run Compose v1 under that name. A
# private apt state reads the trixie index without touching /etc/apt.
install_compose_plugins() {
  local tmp opts deb
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/x"
  echo "deb ${NANOSERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian} trixie main" >"$tmp/sources.list"
  touch "$tmp/status"
  opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "Dir::State::Status=$tmp/status"
    -o APT::Sandbox::User=root)  # the private state is root's; _apt could not write it
  say "installing Compose v2 and buildx (Debian 13's) into $PLUGIN_DIR"
  if ! apt-get "${opts[@]}" update -qq >/dev/null \
    || ! (cd "$tmp" && apt-get "${opts[@]}" download -qq docker-compose docker-buildx >/dev/null); then
    die "could not download Debian 13's docker-compose and docker-buildx"
  fi
  for deb in "$tmp"/docker-compose_*.deb "$tmp"/docker-buildx_*.deb; do
    dpkg-deb -x "$deb" "$tmp/x" || die "could not unpack $deb"
  done
  mkdir -p "$PLUGIN_DIR"
  install -m 0755 "$tmp"/x/usr/libexec/docker/cli-plugins/docker-{compose,buildx} "$PLUGIN_DIR/"
  rm -rf "$tmp"
}

engine_install() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v iptables-save >/dev/null || missing+=(iptables)
  if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
  compose_version_ok || install_compose_plugins
  compose_version_ok || die "docker compose $COMPOSE_MIN or newer is needed: $(docker compose version 2>&1)"
  [ -x "$PLUGIN_DIR/docker-buildx" ] || docker buildx version >/dev/null 2>&1 || install_compose_plugins
}

# --- the host's networking, before and after the daemon ---------------------------------------

net_snapshot() {
  local key
  : >"$ENGINE_STATE/sysctls"
  for key in "${NET_SYSCTLS[@]}"; do
    if sysctl -n "$key" >/dev/null 2>&1; then
      echo "$key=$(sysctl -n "$key")" >>"$ENGINE_STATE/sysctls"
    fi
  done
  ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 >"$ENGINE_STATE/links"
  iptables-save >"$ENGINE_STATE/iptables" 2>/dev/null || true
  ip6tables-save >"$ENGINE_STATE/ip6tables" 2>/dev/null || true
}

# A table dockerd touched goes back to its saved rules; one that did not exist before is emptied
# (no rules, no chains of its own, ACCEPT policies: as an absent table behaves).
restore_tables() {
  local tool=$1 saved=$2 table chain
  [ -s "$saved" ] || [ -n "$("$tool-save" 2>/dev/null)" ] || return 0
  if diff -q <(grep -v '^#' "$saved" | sed 's/\[[0-9:]*\]//') \
    <("$tool-save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9:]*\]//') >/dev/null; then
    return 0
  fi
  for table in filter nat; do
    grep -q "^\*$table\$" "$saved" && continue
    $tool -t "$table" -F 2>/dev/null || continue
    $tool -t "$table" -X
    for chain in $($tool -t "$table" -S | awk '$1 == "-P" {print $2}'); do
      $tool -t "$table" -P "$chain" ACCEPT
    done
  done
  if [ -s "$saved" ]; then
    "$tool-restore" <"$saved"
  fi
}

net_restore() {
  local line link
  while IFS= read -r line; do
    sysctl -qw "$line" >/dev/null || say "warning: could not restore $line"
  done <"$ENGINE_STATE/sysctls"
  command -v iptables >/dev/null && restore_tables iptables "$ENGINE_STATE/iptables"
  command -v ip6tables >/dev/null && restore_tables ip6tables "$ENGINE_STATE/ip6tables"
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    case $link in docker0 | br-* | veth*) ;; *) continue ;; esac
    grep -qx "$link" "$ENGINE_STATE/links" || ip link delete "$link" 2>/dev/null || true
  done
}

# --- the daemon ------------------------------------------------------------------------------

engine_start() {
  local i
  if docker info >/dev/null 2>&1; then
    say "using the docker daemon already running (it stays running)"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "no docker daemon runs, and starting one needs root"
  mkdir -p "$ENGINE_STATE"
  net_snapshot
  ENGINE_OWNED=1
  # its own session: a Ctrl-C to this script reaches the teardown, which stops the stack first
  setsid dockerd >"$ENGINE_STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$ENGINE_STATE/pid"
  for ((i = 0; i < 120; i++)); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$(cat "$ENGINE_STATE/pid")" 2>/dev/null || break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    tail -n 20 "$ENGINE_STATE/dockerd.log" >&2
    die "dockerd did not start (log above: $ENGINE_STATE/dockerd.log)"
  fi
  say "dockerd started: $(docker info --format '{{.ServerVersion}}, storage {{.Driver}}')"
}

# Stops the daemon this run started and puts the host back: networking, and any mount left under
# docker's directories (none after a clean stop). The daemon's log stays in $ENGINE_STATE after a
# failed run ($1, the run's exit status), for a look.
engine_stop() {
  local pid i rc=${1:-0}
  [ "$ENGINE_OWNED" = 1 ] || return 0
  pid=$(cat "$ENGINE_STATE/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "warning: dockerd ignored SIGTERM for 30 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 1
  fi
  awk '$5 ~ "^(/var/lib/docker|/run/docker)/" {print $5}' /proc/self/mountinfo | sort -r \
    | xargs -r -n1 umount -l
  net_restore
  ENGINE_OWNED=0
  if [ "$rc" = 0 ]; then
    rm -rf "$ENGINE_STATE"
  else
    say "dockerd's log: $ENGINE_STATE/dockerd.log"
  fi
  say "dockerd stopped; host networking restored"
}
