"""Container healthcheck of both images: asks the service's own grpc.health.v1.Health whether SERVICE
is SERVING. Docker runs it inside the container, so it dials loopback on the port the service binds.

usage: healthcheck.py SERVICE DEFAULT_PORT   (the port is the service's own port variable when set:
$NANOSERVE_WORKER_PORT for the worker, $NANOSERVE_FRONTEND_PORT for the frontend)
       healthcheck.py http://127.0.0.1:PORT/health   (the gateway: HTTP 200; $NANOSERVE_GATEWAY_PORT
replaces PORT when set)
exit 0: SERVING; exit 1: anything else (NOT_SERVING while loading or draining, refused, timeout).
"""

import os
import sys
import urllib.error
import urllib.parse
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 3.0  # below the compose/Dockerfile `timeout`, so we report instead of being killed
PORT_VARIABLES = {
    "nanoserve.v1.WorkerService": "NANOSERVE_WORKER_PORT",
    "nanoserve.v1.FrontendService": "NANOSERVE_FRONTEND_PORT",
}


def check(service: str, port: int, host: str = "127.0.0.1") -> bool:
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
            )
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def check_http(url: str) -> int:
    """The gateway's probe: GET url answers 200 (its frontend is SERVING)."""
    port = os.environ.get("NANOSERVE_GATEWAY_PORT")
    if port:
        parts = urllib.parse.urlsplit(url)
        url = parts._replace(netloc=f"{parts.hostname}:{port}").geturl()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = response.status
    except (urllib.error.URLError, OSError, ValueError) as e:
        status = getattr(e, "code", None) or str(e)
    if status != 200:
        print(f"healthcheck: {url} answered {status}", file=sys.stderr)
    return 0 if status == 200 else 1


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0].startswith("http://"):
        return check_http(argv[0])
    if len(argv) != 2:
        print("usage: healthcheck.py SERVICE DEFAULT_PORT", file=sys.stderr)
        return 1  # docker reserves exit codes other than 0 and 1
    service, default_port = argv
    variable = PORT_VARIABLES.get(service, "")
    try:
        port = int(os.environ.get(variable) or default_port)
    except ValueError:
        print(f"healthcheck: {variable} is not a port: {os.environ[variable]!r}", file=sys.stderr)
        return 1
    serving = check(service, port)
    if not serving:
        print(f"healthcheck: {service} on port {port} is not SERVING", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
