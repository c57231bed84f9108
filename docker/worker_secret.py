"""The compose stack's one-shot `worker-auth` service (docker-compose.yml): writes the random secret
that the frontend presents to the workers (`authorization: Bearer`) into the shared volume, before
either starts. Only when the file is absent: workers, frontends and replicas added later keep
sharing one secret until `docker compose down -v` removes the volume.

usage: worker_secret.py PATH   (exit 0 when PATH holds a secret afterwards, written now or
before; 1, with the reason, when it cannot be written)
"""

import os
import secrets
import sys
from pathlib import Path

SECRET_BYTES = 32  # 256 bits, URL-safe base64: 43 characters, no newline


def write_once(path: Path) -> bool:
    """Writes a fresh secret to `path` (mode 0600) unless a non-empty one is there; True if written.
    The secret goes to a temporary file first and is linked into place, so a reader never sees a
    partial file and two writers cannot both win."""
    if path.exists() and path.stat().st_size > 0:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            if path.stat().st_size == 0:  # left empty by something else: replace it
                os.replace(tmp, path)
                return True
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        written = write_once(path)
    except OSError as e:  # e.g. the volume is not mounted, or not writable by this user
        print(f"worker_secret.py: cannot write {path}: {e}", file=sys.stderr)
        return 1
    print(f"worker secret {'written to' if written else 'kept in'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
