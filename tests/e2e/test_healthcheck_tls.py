"""docker/healthcheck.py (the compose probe) against a real worker and frontend serving TLS: run as a
subprocess with the service's own NANOSERVE_<SERVICE>_TLS_* variables and the probe's
NANOSERVE_HEALTHCHECK_TLS_* ones, it exits 0 when SERVING over a verified handshake and 1 with a
wrong CA, without the client certificate mutual TLS asks for, or against the wrong name.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.processes import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Pair,
    start_frontend,
    start_serve,
    start_worker,
)
from tests.tls_certs import Certs, make_certs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "docker/healthcheck.py"


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("other"), ca_name="another CA")


@pytest.fixture(scope="module")
def chain_file(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frontend's certificate chain file: its certificate followed by its root."""
    path = tmp_path_factory.mktemp("chain") / "chain.pem"
    path.write_bytes(certs.server_cert.read_bytes() + certs.ca.read_bytes())
    return path


def probe(service: str, port: int, **env: str) -> subprocess.CompletedProcess:
    """healthcheck.py SERVICE 1 with only `env` (and the service's port variable) as NANOSERVE_*."""
    prefix = "NANOSERVE_WORKER_" if service == WORKER_SERVICE else "NANOSERVE_FRONTEND_"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), service, "1"],
        env=clean | {prefix + "PORT": str(port)} | env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def tls_pair(tiny_model_dir, certs, chain_file) -> Iterator[Pair]:
    """A worker under mutual TLS and a frontend serving TLS (plain server auth) in front of it."""
    worker = start_worker(
        tiny_model_dir,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--tls-client-ca-file", str(certs.ca),
        wait=False,
    )  # fmt: skip
    try:
        frontend = start_frontend(
            tiny_model_dir,
            worker.address,
            "--tls-cert-file", str(chain_file),
            "--tls-key-file", str(certs.server_key),
            "--worker-tls-ca-file", str(certs.ca),
            "--worker-tls-client-cert-file", str(certs.client_cert),
            "--worker-tls-client-key-file", str(certs.client_key),
            wait=False,
        )  # fmt: skip
    except BaseException:
        worker.kill()
        raise
    pair = Pair(worker, frontend)
    try:
        env = {
            "NANOSERVE_FRONTEND_TLS_CERT_FILE": str(chain_file),
            "NANOSERVE_HEALTHCHECK_TLS_CA_FILE": str(certs.ca),
        }
        deadline = time.monotonic() + 120
        while probe(FRONTEND_SERVICE, frontend.port, **env).returncode != 0:
            assert frontend.alive() and worker.alive(), frontend.output() + worker.output()
            assert time.monotonic() < deadline, "the frontend never became SERVING over TLS"
            time.sleep(0.5)
        yield pair
    finally:
        pair.stop()


def worker_env(certs: Certs, **extra: str) -> dict[str, str]:
    return {
        "NANOSERVE_WORKER_TLS_CERT_FILE": str(certs.server_cert),
        "NANOSERVE_WORKER_TLS_KEY_FILE": str(certs.server_key),
        "NANOSERVE_WORKER_TLS_CLIENT_CA_FILE": str(certs.ca),
    } | extra


def test_probe_of_a_mutual_tls_worker_needs_its_ca_and_a_client_certificate(
    tls_pair, certs, other_ca
) -> None:
    port = tls_pair.worker.port
    client = {
        "NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE": str(certs.client_cert),
        "NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE": str(certs.client_key),
    }
    good = probe(
        WORKER_SERVICE,
        port,
        **worker_env(certs, NANOSERVE_HEALTHCHECK_TLS_CA_FILE=str(certs.ca)),
        **client,
    )
    assert good.returncode == 0, good.stderr
    wrong_ca = probe(
        WORKER_SERVICE,
        port,
        **worker_env(certs, NANOSERVE_HEALTHCHECK_TLS_CA_FILE=str(other_ca.ca)),
        **client,
    )
    assert wrong_ca.returncode == 1 and "not SERVING" in wrong_ca.stderr
    # a client certificate another CA signed: refused at the handshake
    foreign = probe(
        WORKER_SERVICE,
        port,
        **worker_env(certs, NANOSERVE_HEALTHCHECK_TLS_CA_FILE=str(certs.ca)),
        NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE=str(other_ca.client_cert),
        NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE=str(other_ca.client_key),
    )
    assert foreign.returncode == 1
    missing = probe(WORKER_SERVICE, port, **worker_env(certs))  # no client certificate given
    assert (
        missing.returncode == 1 and "NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE" in missing.stderr
    )
    plaintext = probe(WORKER_SERVICE, port)  # the service's TLS variables unset
    assert plaintext.returncode == 1


def test_probe_of_a_tls_frontend_pins_its_certificate_or_trusts_the_given_ca(
    tls_pair, certs, other_ca, chain_file
) -> None:
    port = tls_pair.frontend.port
    tls = {"NANOSERVE_FRONTEND_TLS_CERT_FILE": str(chain_file)}
    assert probe(FRONTEND_SERVICE, port, **tls).returncode == 0  # the chain ends in its root
    given = probe(FRONTEND_SERVICE, port, **tls, NANOSERVE_HEALTHCHECK_TLS_CA_FILE=str(certs.ca))
    assert given.returncode == 0, given.stderr
    wrong = probe(FRONTEND_SERVICE, port, **tls, NANOSERVE_HEALTHCHECK_TLS_CA_FILE=str(other_ca.ca))
    assert wrong.returncode == 1 and "not SERVING" in wrong.stderr
    # the certificate names localhost and 127.0.0.1, not `frontend`: the name check is kept
    renamed = probe(FRONTEND_SERVICE, port, **tls, NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME="frontend")
    assert renamed.returncode == 1
    named = probe(FRONTEND_SERVICE, port, **tls, NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME="localhost")
    assert named.returncode == 0, named.stderr
    # the service's own certificate as the trust root pins it: the leaf alone suffices too
    leaf_only = probe(
        FRONTEND_SERVICE, port, NANOSERVE_FRONTEND_TLS_CERT_FILE=str(certs.server_cert)
    )
    assert leaf_only.returncode == 0, leaf_only.stderr
    pinned_other = probe(
        FRONTEND_SERVICE, port, NANOSERVE_FRONTEND_TLS_CERT_FILE=str(other_ca.server_cert)
    )
    assert pinned_other.returncode == 1  # a certificate the service does not serve


def test_serve_probes_its_tls_frontend_and_reports_ready(tiny_model_dir, certs) -> None:
    """`nanoserve serve` with frontend TLS (mutual: it asks for client certificates) comes up: its
    readiness probe pins the certificate it handed the frontend and presents the probe client
    certificate; callers need the CA, and a client certificate, too."""
    serve = start_serve(
        tiny_model_dir,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--tls-client-ca-file", str(certs.ca),
        "--probe-tls-client-cert-file", str(certs.client_cert),
        "--probe-tls-client-key-file", str(certs.client_key),
    )  # fmt: skip
    try:
        address = serve.wait_listening()  # printed once both services are SERVING
        client_cert = {"client_cert": certs.client_cert, "client_key": certs.client_key}
        with Client(address, timeout=30, root_certificates=certs.ca, **client_cert) as client:
            assert len(client.generate("hello", max_tokens=3).token_ids) == 3
        port = int(address.rpartition(":")[2])
        env = {
            "NANOSERVE_FRONTEND_TLS_CERT_FILE": str(certs.server_cert),
            "NANOSERVE_FRONTEND_TLS_CLIENT_CA_FILE": str(certs.ca),
            "NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE": str(certs.client_cert),
            "NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE": str(certs.client_key),
        }
        assert probe(FRONTEND_SERVICE, port, **env).returncode == 0
        assert probe(FRONTEND_SERVICE, port).returncode == 1  # plaintext: refused
    finally:
        assert serve.stop(timeout=60) == 0, serve.output()


def test_serve_refuses_a_mutual_tls_frontend_it_cannot_probe(tiny_model_dir, certs) -> None:
    argv = [
        sys.executable, "-m", "nanoserve.cli", "serve", "--model", str(tiny_model_dir),
        "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
        "--tls-client-ca-file", str(certs.ca),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--probe-tls-client-cert-file" in done.stderr
