"""Container healthcheck of both images: asks the service's own grpc.health.v1.Health whether SERVICE
is SERVING. Docker runs it inside the container, so it dials loopback on the port the service binds.

usage: healthcheck.py SERVICE DEFAULT_PORT   (the port is the service's own port variable when set:
$NANOSERVE_WORKER_PORT for the worker, $NANOSERVE_FRONTEND_PORT for the frontend)
       healthcheck.py http://127.0.0.1:PORT/health   (the gateway: HTTP 200; $NANOSERVE_GATEWAY_PORT
replaces PORT when set; HTTPS, with the same TLS variables as below, when the gateway serves it)
exit 0: SERVING; exit 1: anything else (NOT_SERVING while loading or draining, refused, timeout,
a failed TLS handshake).

TLS: when the service serves TLS (its own $NANOSERVE_<SERVICE>_TLS_CERT_FILE is set) the probe does
too, and checks the service's certificate like any client:
  NANOSERVE_HEALTHCHECK_TLS_CA_FILE      the CA that signed it (default: the service's own
                                         TLS_CERT_FILE: the probe then accepts exactly the
                                         certificate the service serves, as gRPC verifies
                                         partial chains; no CA needed)
  NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME  the name it was issued for, when that is not 127.0.0.1
                                         (e.g. `worker`, the name the frontend dials)
Under mutual TLS (the service's TLS_CLIENT_CA_FILE is set) the handshake needs a client certificate
that CA signed, before any RPC (health included) is served:
  NANOSERVE_HEALTHCHECK_TLS_CLIENT_CERT_FILE, NANOSERVE_HEALTHCHECK_TLS_CLIENT_KEY_FILE
"""

import http.client
import os
import socket
import ssl
import sys
import urllib.parse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 3.0  # below the compose/Dockerfile `timeout`, so we report instead of being killed
# the service's config prefix: its port and TLS files are the variables the service itself reads
PREFIXES = {
    "nanoserve.v1.WorkerService": "NANOSERVE_WORKER_",
    "nanoserve.v1.FrontendService": "NANOSERVE_FRONTEND_",
}
PROBE = "NANOSERVE_HEALTHCHECK_TLS_"  # the probe's own TLS variables (no service reads them)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def tls_credentials(prefix: str) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
    """(channel credentials, channel options) for a service whose variables start with `prefix`:
    (None, []) when it serves plaintext. Raises ValueError naming a missing variable."""
    env = os.environ
    cert = env.get(prefix + "TLS_CERT_FILE")
    if not cert:
        return None, []
    client_cert, client_key = client_pair(prefix)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(env.get(PROBE + "CA_FILE") or cert),
        private_key=_read(client_key) if client_key else None,
        certificate_chain=_read(client_cert) if client_cert else None,
    )
    name = env.get(PROBE + "SERVER_NAME")
    return credentials, [("grpc.ssl_target_name_override", name)] if name else []


def client_pair(prefix: str) -> tuple[str | None, str | None]:
    """The probe's client certificate and key (both or neither; required under mutual TLS)."""
    env = os.environ
    client_cert, client_key = (
        env.get(PROBE + "CLIENT_CERT_FILE"),
        env.get(PROBE + "CLIENT_KEY_FILE"),
    )
    if bool(client_cert) != bool(client_key):
        raise ValueError(f"{PROBE}CLIENT_CERT_FILE and {PROBE}CLIENT_KEY_FILE go together")
    if env.get(prefix + "TLS_CLIENT_CA_FILE") and not client_cert:
        raise ValueError(
            f"{prefix}TLS_CLIENT_CA_FILE is set (mutual TLS): set {PROBE}CLIENT_CERT_FILE and "
            f"{PROBE}CLIENT_KEY_FILE to a client certificate that CA signed"
        )
    return client_cert, client_key


def https_context(prefix: str = "NANOSERVE_GATEWAY_") -> ssl.SSLContext | None:
    """The gateway probe's TLS, as tls_credentials for gRPC: None when it serves plain HTTP."""
    cert = os.environ.get(prefix + "TLS_CERT_FILE")
    if not cert:
        return None
    client_cert, client_key = client_pair(prefix)
    context = ssl.create_default_context(cafile=os.environ.get(PROBE + "CA_FILE") or cert)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # its own leaf may be the anchor
    if client_cert:
        context.load_cert_chain(client_cert, client_key)
    return context


def check(
    service: str,
    port: int,
    host: str = "127.0.0.1",
    credentials: grpc.ChannelCredentials | None = None,
    options: list[tuple[str, str]] | None = None,
) -> bool:
    target = f"{host}:{port}"
    channel = (
        grpc.insecure_channel(target, options=options)
        if credentials is None
        else grpc.secure_channel(target, credentials, options=options)
    )
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
            )
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def check_http(url: str) -> int:
    """The gateway's probe: GET url answers 200 (its frontend is SERVING); over HTTPS when the
    gateway serves it, checking its certificate (for $NANOSERVE_HEALTHCHECK_TLS_SERVER_NAME when
    set, else the URL's host)."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    port = int(os.environ.get("NANOSERVE_GATEWAY_PORT") or port)
    try:
        context = https_context()
        sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
        if context is not None:
            name = os.environ.get(PROBE + "SERVER_NAME") or host
            sock = context.wrap_socket(sock, server_hostname=name)
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        conn.sock = sock
        try:
            conn.request("GET", parts.path or "/")
            status: int | str = conn.getresponse().status
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as e:  # ssl.SSLError is an OSError
        status = str(e) or type(e).__name__
    if status != 200:
        print(f"healthcheck: {host}:{port}{parts.path} answered {status}", file=sys.stderr)
    return 0 if status == 200 else 1


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0].startswith("http://"):
        return check_http(argv[0])
    if len(argv) != 2:
        print("usage: healthcheck.py SERVICE DEFAULT_PORT", file=sys.stderr)
        return 1  # docker reserves exit codes other than 0 and 1
    service, default_port = argv
    prefix = PREFIXES.get(service, "NANOSERVE_UNKNOWN_SERVICE_")
    variable = prefix + "PORT"
    try:
        port = int(os.environ.get(variable) or default_port)
    except ValueError:
        print(f"healthcheck: {variable} is not a port: {os.environ[variable]!r}", file=sys.stderr)
        return 1
    try:
        credentials, options = tls_credentials(prefix)
    except (ValueError, OSError) as e:
        print(f"healthcheck: {e}", file=sys.stderr)
        return 1
    serving = check(service, port, credentials=credentials, options=options)
    if not serving:
        print(f"healthcheck: {service} on port {port} is not SERVING", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
