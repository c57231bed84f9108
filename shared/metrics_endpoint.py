"""The HTTP endpoint that serves a service's Prometheus registry at /metrics, on its own thread."""

from prometheus_client import CollectorRegistry, start_http_server


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> object | None:
    """Starts serving `registry` on host:port (port 0: off, returns None); returns the server,
    whose shutdown() stops it."""
    if port == 0:
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
