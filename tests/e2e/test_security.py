"""The public port with TLS, mutual TLS and bearer tokens, against real frontends in front of the
shared worker: handshakes succeed with the right certificates and fail without; a wrong or missing
token gets UNAUTHENTICATED; health answers without one. Plaintext on a public address warns. Two
tenants never share prefix-cache blocks.
"""

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.errors import ServiceError, Unauthenticated, Unavailable
from tests.e2e.processes import Service, start_frontend
from tests.tls_certs import Certs, make_certs

pytestmark = pytest.mark.e2e
TOKEN_A, TOKEN_B = "key-of-tenant-a-0123456789", "key-of-tenant-b-9876543210"


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Certificates of a CA the servers do not trust."""
    return make_certs(tmp_path_factory.mktemp("other"), ca_name="someone else's CA")


def wait_ready(frontend: Service, **client_args) -> None:
    with Client(frontend.wait_listening(), **client_args) as client:
        client.wait_ready(timeout=90)


@pytest.fixture(scope="module")
def tls_frontend(services, tiny_model_dir, certs, tmp_path_factory) -> Iterator[Service]:
    """TLS and tokens (two tenants from a keys file)."""
    keys = tmp_path_factory.mktemp("keys") / "api_keys"
    keys.write_text(f"# tenant key\ntenant-a {TOKEN_A}\ntenant-b {TOKEN_B}\n")
    frontend = start_frontend(
        tiny_model_dir,
        services.worker.address,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--api-keys-file", str(keys),
        wait=False,
    )  # fmt: skip
    try:
        wait_ready(frontend, root_certificates=certs.ca)
    except BaseException:
        frontend.kill()
        raise
    yield frontend
    frontend.stop()


@pytest.fixture(scope="module")
def mtls_frontend(services, tiny_model_dir, certs) -> Iterator[Service]:
    """Mutual TLS: clients need a certificate the test CA signed."""
    frontend = start_frontend(
        tiny_model_dir,
        services.worker.address,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--tls-client-ca-file", str(certs.ca),
        wait=False,
    )  # fmt: skip
    try:
        wait_ready(
            frontend,
            root_certificates=certs.ca,
            client_cert=certs.client_cert,
            client_key=certs.client_key,
        )
    except BaseException:
        frontend.kill()
        raise
    yield frontend
    frontend.stop()


def test_tls_with_the_right_ca_and_token(tls_frontend, certs) -> None:
    with Client(tls_frontend.address, timeout=30, root_certificates=certs.ca, token=TOKEN_A) as c:
        done = c.generate("hello", max_tokens=3, temperature=0)
        assert c.tokenize("hello world") == c.tokenize("hello world")
    assert done.finish_reason == "length" and len(done.token_ids) == 3


def test_tls_refuses_plaintext_and_an_untrusted_ca(tls_frontend, other_ca) -> None:
    with Client(tls_frontend.address, timeout=5, token=TOKEN_A) as plaintext:
        with pytest.raises(Unavailable):
            plaintext.generate("hello", max_tokens=1)
    with Client(
        tls_frontend.address, timeout=5, root_certificates=other_ca.ca, token=TOKEN_A
    ) as wrong_ca:
        with pytest.raises(Unavailable):
            wrong_ca.generate("hello", max_tokens=1)


@pytest.mark.parametrize("token", [None, "not-a-key", TOKEN_A + "x", TOKEN_A[:-1]])
def test_a_missing_or_wrong_token_is_unauthenticated(tls_frontend, certs, token) -> None:
    with Client(tls_frontend.address, timeout=10, root_certificates=certs.ca, token=token) as c:
        with pytest.raises(Unauthenticated, match="bearer token"):
            c.generate("hello", max_tokens=1)
        with pytest.raises(Unauthenticated):
            c.tokenize("hello")
        with pytest.raises(Unauthenticated):
            c.model_info()


def test_health_needs_no_token(tls_frontend, certs) -> None:
    with Client(tls_frontend.address, timeout=10, root_certificates=certs.ca) as c:
        assert c.health() == "SERVING"
        assert c.health(service="") == "SERVING"


def test_a_token_in_other_case_of_bearer_is_accepted(tls_frontend, certs) -> None:
    """RFC 6750: the scheme name is case-insensitive."""
    credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes())
    with grpc.secure_channel(tls_frontend.address, credentials) as channel:
        from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
        from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc

        stub = frontend_grpc.FrontendServiceStub(channel)
        response = stub.Tokenize(
            frontend_pb2.TokenizeRequest(text="hi"),
            metadata=[("authorization", f"bEaReR {TOKEN_B}")],
            timeout=10,
        )
    assert list(response.token_ids)


def test_mtls_needs_a_client_certificate(mtls_frontend, certs, other_ca) -> None:
    with Client(
        mtls_frontend.address,
        timeout=30,
        root_certificates=certs.ca,
        client_cert=certs.client_cert,
        client_key=certs.client_key,
    ) as client:
        assert len(client.generate("hello", max_tokens=2).token_ids) == 2
    with Client(mtls_frontend.address, timeout=5, root_certificates=certs.ca) as no_cert:
        with pytest.raises(ServiceError):
            no_cert.generate("hello", max_tokens=1)
    with Client(
        mtls_frontend.address,
        timeout=5,
        root_certificates=certs.ca,
        client_cert=other_ca.client_cert,
        client_key=other_ca.client_key,
    ) as untrusted:
        with pytest.raises(ServiceError):
            untrusted.generate("hello", max_tokens=1)


def test_plaintext_on_a_public_address_warns(services, tiny_model_dir: Path) -> None:
    frontend = start_frontend(
        tiny_model_dir, services.worker.address, "--host", "0.0.0.0", wait=False
    )
    try:
        frontend.wait_listening()
        time.sleep(0.2)
        assert any("in plaintext" in line for line in frontend.lines), frontend.output()
    finally:
        frontend.stop()


def test_loopback_plaintext_does_not_warn(services) -> None:
    assert not any("in plaintext" in line for line in services.frontend.lines)


def test_async_client_with_tls_and_a_token(tls_frontend, certs) -> None:
    import asyncio

    from nanoserve.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(
            tls_frontend.address, timeout=30, root_certificates=certs.ca, token=TOKEN_B
        ) as client:
            done = await client.generate("hello", max_tokens=2)
            assert len(done.token_ids) == 2
        async with AsyncClient(
            tls_frontend.address, timeout=30, root_certificates=certs.ca, token="wrong"
        ) as client:
            with pytest.raises(Unauthenticated):
                await client.generate("hello", max_tokens=2)
            assert await client.health() == "SERVING"

    asyncio.run(main())


def test_tenants_do_not_share_the_prefix_cache(tls_frontend, certs) -> None:
    """--cache-isolation tenant (the default): the second tenant's first call of a prompt hits
    nothing, though the first tenant's blocks are cached; each tenant's repeat hits its own."""
    # unique, and longer than a few 16-token blocks
    prompt = f"{uuid.uuid4().hex} " + "the same long shared system prompt " * 8

    def cached(token: str) -> int:
        with Client(
            tls_frontend.address, timeout=30, root_certificates=certs.ca, token=token
        ) as client:
            done = client.generate(prompt, max_tokens=1, temperature=0)
        assert done.usage is not None and done.usage.prompt_tokens > 48
        return done.usage.cached_tokens

    assert cached(TOKEN_A) == 0
    assert cached(TOKEN_B) == 0  # tenant a's blocks are cached, but not for tenant b
    assert cached(TOKEN_A) > 0
    assert cached(TOKEN_B) > 0
