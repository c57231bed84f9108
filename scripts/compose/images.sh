# shellcheck shell=bash disable=SC2034  # ROOTFS: read by the caller's teardown
# Sourced by scripts/compose_cpu.sh: the project's three images without a container registry. The
# base is made from Debian's package archive (debootstrap, then `docker import`) and stands in for
# the Dockerfiles' registry bases through their BASE_IMAGE argument; the Python packages come from
# a wheelhouse the host fills (docker/wheelhouse), so a build has no network of its own for pip.

BASE_IMAGE=local/python:3.11-bookworm  # Debian 12's Python 3.11 in a venv, first on PATH
WHEELHOUSE=docker/wheelhouse
ROOTFS=''  # a rootfs being made: the caller's teardown removes it when a step failed
# as Debian's own slim images: no manuals, docs (but their copyright files) or translations, also
# for what the Dockerfiles install later (the worker's gcc)
DPKG_SLIM='path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*'

# Deletes a rootfs and its debootstrap log, with nothing left mounted under it (debootstrap
# mounts /proc and /sys there).
remove_rootfs() {
  local root=$1
  [ -d "$root" ] || return 0
  awk -v r="$root/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r \
    | xargs -r -n1 umount -l
  rm -rf --one-file-system "$root" "$root.log"
}

base_image() {
  local root mirror=${NANOSERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "making $BASE_IMAGE (debootstrap) needs root"
  say "making $BASE_IMAGE from $mirror (debootstrap, about a minute)"
  root=$(mktemp -d /var/tmp/nanoserve-rootfs.XXXXXX)
  ROOTFS=$root  # the caller's teardown removes it, should this fail half-way
  debootstrap --variant=minbase --include=python3-venv bookworm "$root" "$mirror" \
    >"$root.log" 2>&1 || {
    tail -n 20 "$root.log" >&2
    die "debootstrap failed (log above)"
  }
  printf '%s\n' "$DPKG_SLIM" >"$root/etc/dpkg/dpkg.cfg.d/slim"
  find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
  rm -rf "$root"/usr/share/{man,info,locale,lintian}/* "$root"/var/cache/apt/* \
    "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
  # the worker's Dockerfile installs gcc with apt: the point releases and security updates too
  cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  # a venv keeps pip off Debian's own Python (PEP 668) and gives the Dockerfiles bare python/pip
  chroot "$root" python3 -m venv /opt/venv
  tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python"]' - "$BASE_IMAGE" >/dev/null
  remove_rootfs "$root"
  ROOTFS=''
}

# Every wheel the three images install, built or downloaded on the host at the versions the host's
# venv runs (its `pip freeze` as constraints: the CPU torch, triton 3.6 as in the GPU image). Kept
# while the requirement lists and those versions stay the same.
wheelhouse() {
  local tmp stamp
  tmp=$(mktemp -d)
  python docker/requirements.py pyproject.toml frontend worker gateway tracing >"$tmp/requirements.txt"
  python docker/requirements.py pyproject.toml --build >>"$tmp/requirements.txt"
  python -m pip freeze --exclude-editable | grep -v '^nanoserve' >"$tmp/constraints.txt"
  stamp=$(cat "$tmp/requirements.txt" "$tmp/constraints.txt" | sha256sum | cut -c1-16)
  if [ "$(cat "$WHEELHOUSE/.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "filling $WHEELHOUSE (pip wheel on the host)"
    find "$WHEELHOUSE" -maxdepth 1 -name '*.whl' -delete
    # (a pip config's missing local index prints a warning per package: noise, left out)
    python -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELHOUSE" \
      -r "$tmp/requirements.txt" -c "$tmp/constraints.txt" 2>&1 \
      | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2 \
      || die "pip wheel could not fill $WHEELHOUSE"
    echo "$stamp" >"$WHEELHOUSE/.stamp"
  fi
  rm -rf "$tmp"
}

# The compose file's own build sections, on the local base, with pip limited to the wheelhouse.
# BuildKit's step-by-step log goes to a file, shown when the build fails.
build_images() {
  local log
  log=$(mktemp /tmp/nanoserve-build.XXXXXX)
  say "building the images (base $BASE_IMAGE, wheels from $WHEELHOUSE)"
  if ! compose --progress plain build --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg PIP_NO_INDEX=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    die "the image build failed (whole log: $log)"
  fi
  rm -f "$log"
}
