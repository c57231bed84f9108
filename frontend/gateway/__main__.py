"""`python -m nanoserve.frontend.gateway --frontend-address HOST:PORT --port P`: serves the OpenAI
HTTP API on uvicorn until SIGTERM or SIGINT, with one gRPC channel to the frontend, a request log
line per request and, with --metrics-port, Prometheus metrics (access.py, metrics.py).
A gateway that cannot start (a busy port, a missing certificate) says why in one line, exit 1.
"""

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Iterator
from typing import Any

from nanoserve.config import parse_config
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.log import log_startup_error, setup_logging
from nanoserve.process import die_with_starter
from nanoserve.startup_heap import freeze_startup_heap
from nanoserve.tracing import tracer_for

logger = logging.getLogger("nanoserve.gateway")


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The listening socket, bound here so that port 0 is known before uvicorn starts.
    reuse_port: other processes that set it too may bind the same port (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(config: GatewayConfig) -> None:
    import uvicorn  # the `gateway` extra
    from starlette.routing import Route

    from nanoserve.client import AsyncClient
    from nanoserve.frontend.gateway.access import AccessLog, RequestLog
    from nanoserve.frontend.gateway.app import build_app
    from nanoserve.frontend.gateway.body_limit import BodyLimit
    from nanoserve.frontend.gateway.header_timeout import with_header_timeout

    client = AsyncClient(
        config.frontend_address,
        timeout=config.request_timeout_s or None,
        max_message_bytes=config.max_message_bytes,
        root_certificates=config.root_certificates,
        client_cert=config.tls_client_cert_file,
        client_key=config.tls_client_key_file,
        connections=config.frontend_connections,
    )
    sock = bind(config.host, config.port, config.reuse_port)
    api = build_app(client, config.served_model_name, stream_interval=config.stream_interval)
    paths = [route.path for route in api.routes if isinstance(route, Route)]
    sinks: list = [RequestLog(config.log_format)]
    tracer = tracer_for("nanoserve-gateway", config.otlp_traces_endpoint)
    start_span = None
    if tracer is not None:  # the OpenTelemetry SDK is imported only then
        from nanoserve.frontend.gateway.request_trace import RequestTracer

        request_tracer = RequestTracer(tracer)
        sinks.append(request_tracer)
        start_span = request_tracer.start
    app = AccessLog(BodyLimit(api, config.max_body_bytes), paths, sinks, start_span)
    metrics_server: Any = None
    if config.metrics_port:  # prometheus_client is imported only when asked for
        from nanoserve.frontend.gateway.metrics import serve_gateway_metrics

        metrics_server = serve_gateway_metrics(app, config.metrics_port, config.host)

    class Server(uvicorn.Server):
        """uvicorn's server with our signal handling: SIGTERM drains and the process exits 0
        (uvicorn's own handlers re-raise the signal after shutdown, ending the process by it)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, lambda: setattr(self, "should_exit", True))
            yield

    server_config = uvicorn.Config(
        app,
        log_level=config.log_level.lower(),
        access_log=config.log_level.upper() == "DEBUG",
        log_config=None,  # keep nanoserve's log format (setup_logging)
        timeout_graceful_shutdown=max(1, round(config.grace_period_s)),
        timeout_keep_alive=config.keep_alive_timeout_s,  # type: ignore[arg-type]  # a float works
        ssl_certfile=config.tls_cert_file,  # HTTPS, and with a client CA, mutual TLS
        ssl_keyfile=config.tls_key_file,
        ssl_ca_certs=config.tls_client_ca_file,
        ssl_cert_reqs=ssl.CERT_REQUIRED if config.tls_client_ca_file else ssl.CERT_NONE,
    )
    server_config.load()  # resolves the HTTP protocol class, wrapped here
    server_config.http_protocol_class = with_header_timeout(
        server_config.http_protocol_class, config.header_timeout_s
    )
    server = Server(server_config)
    host, port = sock.getsockname()[:2]
    logger.info("gateway listening on %s:%d (frontend %s)", host, port, config.frontend_address)
    freeze_startup_heap("gateway")
    try:
        await server.serve(sockets=[sock])
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        await client.close()
        if tracer is not None:
            tracer.shutdown()
        logger.info("gateway stopped")


def main(argv: list[str] | None = None, prog: str = "python -m nanoserve.frontend.gateway") -> None:
    die_with_starter()  # (where `nanoserve serve` or a benchmark started this process)
    config = parse_config(GatewayConfig, argv, prog=prog)
    setup_logging("gateway", config.log_level)
    try:
        asyncio.run(serve(config))
    except OSError as e:  # a busy port, an unreadable certificate
        log_startup_error(logger, e)
        sys.exit(1)
    except ImportError as e:
        hint = "" if "nanoserve[" in str(e) else ": pip install 'nanoserve[gateway]'"
        log_startup_error(logger, ImportError(f"{e}{hint}"))
        sys.exit(1)


if __name__ == "__main__":
    main()
