"""docker/healthcheck.py, the images' health probe: its exit code against a real gRPC health service
(plain, and mutual TLS with the compose file's `#tls ` environment) and an HTTP(S) /health."""

import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.unit.compose_files import (
    GRPC_SERVICES,
    ROOT,
    container_env,
    load_compose_tls,
    load_healthcheck,
    run,
)


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(0)


def test_healthcheck_exits_0_only_when_serving(health_server, monkeypatch) -> None:
    port, servicer = health_server
    check = load_healthcheck()
    service = GRPC_SERVICES["worker"]
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", str(port))
    monkeypatch.setenv("NANOSERVE_FRONTEND_PORT", "1")  # the other service's variable is not read
    assert check.main([service, "1"]) == 1  # unknown to the server yet: NOT_FOUND
    servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check.main([service, "1"]) == 1
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    assert check.main([service, "1"]) == 0
    assert check.main([GRPC_SERVICES["frontend"], "1"]) == 1  # another service's health
    monkeypatch.delenv("NANOSERVE_WORKER_PORT")
    assert check.main([service, str(port)]) == 0  # the default port when the env var is unset
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", "http")
    assert check.main([service, str(port)]) == 1
    assert check.main([service]) == 1


def test_healthcheck_script_reports_through_its_exit_code(health_server) -> None:
    port, servicer = health_server
    service = GRPC_SERVICES["frontend"]
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    script = [sys.executable, str(ROOT / "docker/healthcheck.py")]
    assert run([*script, service, str(port)]).returncode == 0
    server_gone = run([*script, service, str(port)], NANOSERVE_FRONTEND_PORT="1")
    assert server_gone.returncode == 1 and "not SERVING" in server_gone.stderr


def test_healthcheck_probes_the_gateway_over_http(monkeypatch) -> None:
    """The gateway's probe: exit 0 only on HTTP 200 from /health; its port variable wins."""
    import http.server
    import threading

    answer = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(answer["status"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        check = load_healthcheck()
        monkeypatch.delenv("NANOSERVE_GATEWAY_PORT", raising=False)
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 0
        answer["status"] = 503
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 1
        answer["status"] = 200
        monkeypatch.setenv("NANOSERVE_GATEWAY_PORT", str(port))
        assert check.main(["http://127.0.0.1:1/health"]) == 0
        monkeypatch.setenv("NANOSERVE_GATEWAY_PORT", "1")
        assert check.main([f"http://127.0.0.1:{port}/health"]) == 1  # nothing listens on 1
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_probes_an_https_gateway(tmp_path, monkeypatch) -> None:
    """A gateway serving HTTPS with mutual TLS ($NANOSERVE_GATEWAY_TLS_*): the probe speaks TLS,
    trusts the gateway's own certificate unless given a CA, presents its client certificate, and
    checks the name the certificate was issued for."""
    import http.server
    import ssl
    import threading

    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs", dns_names=("gateway",))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
    context.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    check = load_healthcheck()
    try:
        assert check.main([url]) == 1  # plain HTTP against TLS
        monkeypatch.setenv("NANOSERVE_GATEWAY_TLS_CERT_FILE", str(certs.server_cert))
        monkeypatch.setenv("NANOSERVE_GATEWAY_TLS_KEY_FILE", str(certs.server_key))
        monkeypatch.setenv("NANOSERVE_GATEWAY_TLS_CLIENT_CA_FILE", str(certs.ca))
        assert check.main([url]) == 1  # mutual TLS and no client certificate: refused before
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE", str(certs.client_cert))
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE", str(certs.client_key))
        assert check.main([url]) == 0  # the gateway's own leaf trusted; 127.0.0.1 is in it
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_CA_FILE", str(certs.ca))
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME", "gateway")
        assert check.main([url]) == 0
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME", "frontend")
        assert check.main([url]) == 1  # not the name the certificate holds
        monkeypatch.delenv("NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME")
        other = make_certs(tmp_path / "other", ca_name="another CA")
        monkeypatch.setenv("NANOSERVE_HEALTHCHECK_TLS_CA_FILE", str(other.ca))
        assert check.main([url]) == 1  # a CA that did not sign it
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def mtls_health_server(tmp_path) -> Iterator[tuple[int, health.HealthServicer, Path]]:
    """A health service behind mutual TLS, its certificates (for the name `worker`) where the
    compose file's `#tls ` lines mount them."""
    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs", dns_names=("worker",))
    servicer = health.HealthServicer()
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials(
        [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield port, servicer, certs.ca.parent
    server.stop(0)


def test_healthcheck_with_the_compose_tls_environment(mtls_health_server, monkeypatch) -> None:
    """The worker's probe, with the environment the `#tls ` lines give it, against a server that
    asks for client certificates: SERVING only over the verified mutual handshake."""
    port, servicer, certs_dir = mtls_health_server
    service = GRPC_SERVICES["worker"]
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    worker = load_compose_tls()["services"]["worker"]
    for key in [k for k in os.environ if k.startswith("NANOSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in container_env(worker, certs_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NANOSERVE_WORKER_PORT", str(port))
    check = load_healthcheck()
    assert check.main([service, "1"]) == 0
    servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check.main([service, "1"]) == 1
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    monkeypatch.delenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE")
    assert check.main([service, "1"]) == 1  # half a client certificate
    monkeypatch.delenv("NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE")
    assert check.main([service, "1"]) == 1  # none: mutual TLS refuses the handshake
    monkeypatch.delenv("NANOSERVE_WORKER_TLS_CLIENT_CA_FILE")  # the probe cannot tell: refused
    assert check.main([service, "1"]) == 1
    monkeypatch.delenv("NANOSERVE_WORKER_TLS_CERT_FILE")
    assert check.main([service, "1"]) == 1  # plaintext against TLS
