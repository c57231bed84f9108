"""The gateway's Prometheus metrics, recorded once per HTTP request as it ends (an Access record from
access.py) and served from their own registry on --metrics-port. Names are `nanoserve:gateway_*`,
labelled by route (a served path, or `other`); no model_name: a gateway serves one model.
"""

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nanoserve.frontend.gateway.access import Access, AccessLog
from nanoserve.metric_buckets import BODY_BYTES_BUCKETS, TTFT_BUCKETS
from nanoserve.metrics_endpoint import serve_metrics

# Request latency spans /health (~1 ms) to long completions (minutes): vLLM's TTFT buckets cover
# both, 1 ms to 2560 s.
LATENCY_BUCKETS = TTFT_BUCKETS


class GatewayMetrics:
    """The gateway's metric objects in their own registry; `observe` is an Access sink."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r, route = self.registry, ["route"]
        self.requests = Counter(
            "nanoserve:gateway_requests",
            "HTTP requests ended, by route and status (499: the client went away first; a stream "
            "that failed after its 200 counts under its error event's status)",
            route + ["status"],
            registry=r,
        )
        self.latency = Histogram(
            "nanoserve:gateway_request_duration_seconds",
            "Arrival at the gateway to the response's end (a stream's last event)",
            route,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_event = Histogram(
            "nanoserve:gateway_time_to_first_event_seconds",
            "Arrival at the gateway to a stream's first server-sent event",
            route,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.body_bytes = Histogram(
            "nanoserve:gateway_request_body_bytes",
            "Request body bytes read, per POST request",
            route,
            buckets=BODY_BYTES_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "nanoserve:gateway_prompt_tokens",
            "Prompt tokens of completions whose usage came back",
            route,
            registry=r,
        )
        self.completion_tokens = Counter(
            "nanoserve:gateway_completion_tokens",
            "Completion tokens of completions whose usage came back",
            route,
            registry=r,
        )
        self.in_flight = Gauge(
            "nanoserve:gateway_requests_in_flight", "HTTP requests in flight", registry=r
        )
        self._children: dict[tuple[int, str, int], Any] = {}

    def track_in_flight(self, read: Callable[[], float]) -> None:
        """Reads the in-flight gauge from `read()` at scrape time (no cost per request)."""
        self.in_flight.set_function(read)

    def _child(self, metric: Any, route: str, status: int = 0) -> Any:
        """metric.labels(route[, status]), looked up once: labels() takes a lock and validates,
        ~10x an observe(). Routes are the app's paths and `other`, statuses the app's few."""
        key = (id(metric), route, status)
        child = self._children.get(key)
        if child is None:
            labels = (route, str(status)) if status else (route,)
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, access: Access) -> None:
        """Counts one ended request."""
        child, route = self._child, access.route
        child(self.requests, route, access.outcome).inc()
        child(self.latency, route).observe(access.duration)
        if access.method == "POST":
            child(self.body_bytes, route).observe(access.body_bytes)
        ttft = access.ttft
        if ttft is not None:
            child(self.first_event, route).observe(ttft)
        if access.prompt_tokens is not None:
            child(self.prompt_tokens, route).inc(access.prompt_tokens)
        if access.completion_tokens is not None:
            child(self.completion_tokens, route).inc(access.completion_tokens)


def serve_gateway_metrics(access: AccessLog, port: int, host: str) -> object | None:
    """Adds the metrics as a sink of `access` and serves them on host:port (a thread of
    prometheus_client's); returns the server, whose shutdown() stops it (None: port 0, off)."""
    if port == 0:
        return None
    metrics = GatewayMetrics()
    metrics.track_in_flight(lambda: access.in_flight)
    # first of the sinks: a request's counters move before its log line is written, so whoever
    # reads the line (an operator, a test) and then scrapes sees the request counted
    access.sinks.insert(0, metrics.observe)
    return serve_metrics(metrics.registry, port, host)
