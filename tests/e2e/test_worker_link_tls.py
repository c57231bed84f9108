"""The frontend -> worker link over mutual TLS, against a real worker and frontend: the frontend with
its client certificate serves requests; a caller of the worker without a certificate the worker's
client CA signed (or in plaintext) is refused at the handshake. `nanoserve serve` passes the flags
to both services.
"""

import re
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.client import Client
from nanoserve.security import channel_credentials
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Pair,
    start_frontend,
    start_serve,
    start_worker,
)
from tests.tls_certs import make_certs

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mtls_pair(tiny_model_dir, certs) -> Iterator[Pair]:
    worker = start_worker(
        tiny_model_dir,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--tls-client-ca-file", str(certs.ca),
        wait=False,
    )  # fmt: skip
    try:
        frontend = start_frontend(  # its health turns SERVING once the worker answered over mTLS
            tiny_model_dir,
            worker.address,
            "--worker-tls-ca-file", str(certs.ca),
            "--worker-tls-client-cert-file", str(certs.client_cert),
            "--worker-tls-client-key-file", str(certs.client_key),
        )  # fmt: skip
    except BaseException:
        worker.kill()
        raise
    pair = Pair(worker, frontend)
    yield pair
    pair.stop()


def worker_health(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    """The worker's health status, or the code of the failed call."""
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=5
            )
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def test_the_frontend_reaches_the_worker_over_mtls(mtls_pair) -> None:
    with Client(mtls_pair.frontend.address, timeout=30) as client:
        assert client.health(service=FRONTEND_SERVICE) == "SERVING"
        done = client.generate("hello over mutual TLS", max_tokens=4, temperature=0)
    assert done.finish_reason == "length" and len(done.token_ids) == 4


def test_the_worker_refuses_callers_without_a_client_certificate(mtls_pair, certs) -> None:
    address = mtls_pair.worker.address
    with_cert = channel_credentials(certs.ca, certs.client_cert, certs.client_key)
    assert worker_health(address, with_cert) == "SERVING"
    assert worker_health(address, channel_credentials(certs.ca)) == "UNAVAILABLE"  # no cert
    assert worker_health(address, None) == "UNAVAILABLE"  # plaintext
    stranger = make_certs(certs.ca.parent / "stranger", ca_name="someone else's CA")
    signed_elsewhere = channel_credentials(certs.ca, stranger.client_cert, stranger.client_key)
    assert worker_health(address, signed_elsewhere) == "UNAVAILABLE"


def test_a_plaintext_worker_on_a_public_address_warns(tiny_model_dir) -> None:
    worker = start_worker(
        tiny_model_dir, "--host", "0.0.0.0", "--allow-unauthenticated", wait=False
    )
    try:
        time.sleep(0.2)
        assert any("in plaintext" in line for line in worker.lines), worker.output()
    finally:
        worker.stop()


def test_serve_runs_the_worker_link_over_mtls(tiny_model_dir, certs) -> None:
    serve = start_serve(
        tiny_model_dir,
        "--worker-tls-cert-file", str(certs.server_cert),
        "--worker-tls-key-file", str(certs.server_key),
        "--worker-tls-client-ca-file", str(certs.ca),
        "--worker-tls-ca-file", str(certs.ca),
        "--worker-tls-client-cert-file", str(certs.client_cert),
        "--worker-tls-client-key-file", str(certs.client_key),
    )  # fmt: skip
    try:
        address = serve.wait_listening()  # printed once both services are SERVING
        with Client(address, timeout=30) as client:
            assert len(client.generate("hello", max_tokens=3).token_ids) == 3
        worker = next(m for line in serve.lines if (m := re.search(r"\(worker on (\S+)\)", line)))
        assert worker_health(worker.group(1), channel_credentials(certs.ca)) == "UNAVAILABLE"
    finally:
        serve.stop(timeout=60)
