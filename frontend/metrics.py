"""The frontend's Prometheus metrics, recorded once per request when it ends (a RequestRecord from
frontend/request_log.py). Names are vLLM's where vLLM has the metric (its dashboards and alerts
apply), `nanoserve:` otherwise; every series carries the label model_name, as vLLM's do.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nanoserve.frontend.request_log import RequestRecord
from nanoserve.metric_buckets import E2E_BUCKETS, FRONTEND_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS


class FrontendMetrics:
    """The frontend's metric objects in their own registry; `observe` is a request sink."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self._children: dict[tuple, object] = {}
        r, m = self.registry, ["model_name"]
        self.success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason",
            m + ["finished_reason"],
            registry=r,
        )
        self.errors = Counter(
            "nanoserve:request_errors",
            "Requests ended without finishing, by gRPC status code",
            m + ["code"],
            registry=r,
        )
        self.admission_refusals = Counter(
            "nanoserve:admission_refusals",
            "Requests refused at admission (RESOURCE_EXHAUSTED)",
            m,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests", m, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens streamed to clients", m, registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, as the frontend sees it",
            m,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Mean time between tokens, one sample per request",
            m,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to end of a finished request",
            m,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.frontend_latency = Histogram(
            "nanoserve:frontend_latency_seconds",
            "The frontend's own part of a request's latency: arrival to the request sent to the "
            "worker (tokenize, chat template, validate)",
            m,
            buckets=FRONTEND_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "nanoserve:frontend_requests_in_flight",
            "Generate/Chat calls in flight on the frontend",
            m,
            registry=r,
        )

    def track_in_flight(self, read) -> None:
        """Reads the in-flight gauge from `read()` at scrape time."""
        self.in_flight.labels(self.model_name).set_function(read)

    def _child(self, metric, *labels: str):
        """metric.labels(model_name, *labels), looked up once: labels() takes a lock and
        validates, ~10x an inc()."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, *labels)
        return child

    def observe(self, record: RequestRecord) -> None:
        """Counts one ended request."""
        child = self._child
        child(self.generation_tokens).inc(record.completion_tokens)
        if record.code == "OK" and record.finish_reason is not None:
            child(self.success, record.finish_reason).inc()
            child(self.prompt_tokens).inc(record.prompt_tokens)
            child(self.e2e).observe(record.duration)
        else:
            child(self.errors, record.code).inc()
            if record.code == "RESOURCE_EXHAUSTED":
                child(self.admission_refusals).inc()
        if record.ttft is not None:
            child(self.ttft).observe(record.ttft)
        if record.frontend_latency is not None:
            child(self.frontend_latency).observe(record.frontend_latency)
        if record.inter_token_latency is not None:
            child(self.itl).observe(record.inter_token_latency)
