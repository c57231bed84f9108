"""Issue 32: the tenants' prefix-cache salts are keyed (HMAC-SHA256 under the server's key, not a
plain hash of the tenant's name that anyone reaching a worker could compute), and a worker refuses
to serve a public address with no credential unless told to."""

import hashlib

import pytest

from nanoserve import security
from nanoserve.worker.config import WorkerConfig


def salt_as(tenant: str | None) -> str:
    token = security._tenant.set(tenant)
    try:
        return security.tenant_cache_salt()
    finally:
        security._tenant.reset(token)


def test_the_salt_is_a_keyed_mac_of_the_tenant() -> None:
    old = security._salt_key[0]
    try:
        security.set_cache_salt_key("key-one")
        one = salt_as("alice")
        assert one != hashlib.sha256(b"nanoserve tenant\0alice").hexdigest()  # 5806f92's
        assert len(one) == 64 and one == salt_as("alice") and one != salt_as("bob")
        security.set_cache_salt_key(b"key-two")
        assert salt_as("alice") != one  # who lacks the key cannot derive it
        security.set_cache_salt_key(None)  # keeps the current key
        assert salt_as("alice") == salt_as("alice") and salt_as(None) == ""
    finally:
        security._salt_key[0] = old


def test_read_secret(tmp_path) -> None:
    f = tmp_path / "t"
    f.write_text("# the link's secret\nfrontend s3cret\nother x\n")
    assert security.read_secret(str(f)) == "s3cret" and security.read_secret(None) is None
    f.write_text("# nothing\n")
    with pytest.raises(ValueError):
        security.read_secret(str(f))


def test_a_public_worker_needs_a_credential(tmp_path) -> None:
    with pytest.raises(ValueError, match="auth_token_file"):
        WorkerConfig(model=str(tmp_path), host="0.0.0.0")
    WorkerConfig(model=str(tmp_path), host="0.0.0.0", auth_token_file="t")
    WorkerConfig(model=str(tmp_path), host="0.0.0.0", allow_unauthenticated=True)
    WorkerConfig(model=str(tmp_path), host="127.0.0.1")  # loopback: this machine's users only
