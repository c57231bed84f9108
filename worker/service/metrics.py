"""The worker's Prometheus metrics: gauges and counters read when /metrics is scraped from the
latest load report of the engine core process (AsyncEngine.load; no cost between scrapes), and
histograms observed per engine step and per finished request as its frames arrive (EngineHistograms).
Names are vLLM's where vLLM has the metric, so its dashboards and alerts apply; the rest are
`nanoserve:`. Every series carries the label model_name, as vLLM's do.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from nanoserve.metric_buckets import (
    BATCH_SIZE_BUCKETS,
    E2E_BUCKETS,
    ITERATION_TOKEN_BUCKETS,
    STEP_BUCKETS,
)
from nanoserve.metrics_endpoint import serve_metrics
from nanoserve.worker.core.frames import Finish
from nanoserve.worker.core.stats_log import Load


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One reading of the engine: the GetLoad numbers plus cumulative token counters."""

    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of which were found there
    num_preemptions: int
    prompt_tokens: int  # prompt tokens prefilled (cache hits excluded)
    generation_tokens: int
    num_finished: int

    @classmethod
    def from_load(cls, load: Load, num_finished: int) -> "WorkerLoad":
        """Reads an AsyncEngine's latest load report of the engine core process
        (engine_core.EngineCore.load: sent every step, and when the core goes idle)."""
        return cls(
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_free_blocks=load.num_free_blocks,
            num_total_blocks=load.num_total_blocks,
            prefix_cache_queries=load.prefix_cache_queries,
            prefix_cache_hits=load.prefix_cache_hits,
            num_preemptions=load.num_preemptions,
            prompt_tokens=load.num_prompt_tokens,
            generation_tokens=load.num_generated_tokens,
            num_finished=num_finished,
        )


class WorkerCollector(Collector):
    """Turns a WorkerLoad, read at scrape time, into metric families. `read` returns None while
    the model loads: then only nanoserve:worker_ready (0) is exposed."""

    def __init__(self, model_name: str, read: Callable[[], WorkerLoad | None]) -> None:
        self.model_name = model_name
        self.read = read

    def collect(self) -> Iterator:
        labels = ["model_name"]
        value = [self.model_name]
        load = self.read()
        ready = GaugeMetricFamily(
            "nanoserve:worker_ready", "1 once the engine is loaded and serving", labels=labels
        )
        ready.add_metric(value, 0.0 if load is None else 1.0)
        yield ready
        if load is None:
            return
        total = load.num_total_blocks
        gauges = {
            "vllm:num_requests_running": ("Requests in the running batch", load.num_running),
            "vllm:num_requests_waiting": ("Requests waiting to be scheduled", load.num_waiting),
            "vllm:kv_cache_usage_perc": (
                "KV-cache usage, 1 = full",
                1.0 - load.num_free_blocks / total if total else 0.0,
            ),
            "nanoserve:kv_cache_free_blocks": ("KV-cache blocks free", load.num_free_blocks),
            "nanoserve:kv_cache_total_blocks": ("KV-cache blocks in all", load.num_total_blocks),
        }
        for name, (doc, number) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(value, float(number))
            yield family
        counters = {  # prometheus_client appends _total on exposition
            "vllm:prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache",
                load.prefix_cache_queries,
            ),
            "vllm:prefix_cache_hits": (
                "Prompt tokens found in the prefix cache",
                load.prefix_cache_hits,
            ),
            "vllm:num_preemptions": ("Sequences preempted", load.num_preemptions),
            "vllm:prompt_tokens": ("Prompt tokens prefilled", load.prompt_tokens),
            "vllm:generation_tokens": ("Tokens generated", load.generation_tokens),
            "nanoserve:worker_requests_finished": ("Requests finished", load.num_finished),
        }
        for name, (doc, number) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(value, float(number))
            yield counter


class EngineHistograms:
    """Observed on the event loop as the engine core's STEP frames arrive (AsyncEngine._on_step):
    three observations per step, three per finished request; prometheus_client locks each against
    the scrape thread."""

    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        def histogram(name: str, doc: str, buckets: tuple) -> Any:
            family = Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry)
            return family.labels(model_name)  # the child: observe() without a label lookup

        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Arrival at the engine core to first scheduled, per finished request",
            E2E_BUCKETS,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "First scheduled to first token (all prompt chunks), per finished request",
            E2E_BUCKETS,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "First token to finish, per finished request",
            E2E_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Tokens computed per engine step (prompt tokens prefilled + tokens sampled)",
            ITERATION_TOKEN_BUCKETS,
        )
        self.batch_size = histogram(
            "nanoserve:batch_size",
            "Sequences that sampled a token, per engine step",
            BATCH_SIZE_BUCKETS,
        )
        self.step_time = histogram(
            "nanoserve:engine_step_duration_seconds",
            "Duration of one engine step (schedule, forward, sample, postprocess)",
            STEP_BUCKETS,
        )

    def observe_step(self, num_seqs: int, num_tokens: int, step_s: float) -> None:
        self.batch_size.observe(num_seqs)
        self.iteration_tokens.observe(num_tokens)
        self.step_time.observe(step_s)

    def observe_finish(self, finish: Finish) -> None:
        self.queue.observe(finish.queue_s)
        self.prefill.observe(finish.prefill_s)
        self.decode.observe(finish.decode_s)


def worker_registry(model_name: str, read: Callable[[], WorkerLoad | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(model_name, read))
    return registry


def serve_worker_metrics(servicer, model_name: str, port: int, host: str) -> object | None:
    """Serves /metrics for a WorkerServicer: nothing but worker_ready until its engine is set
    (once loaded). Runs in prometheus_client's thread: it only reads AsyncEngine.load, a list the
    event loop replaces whole, and an int."""

    def read() -> WorkerLoad | None:
        engine = servicer.engine  # an AsyncEngine, or None while loading
        if engine is None:
            return None
        return WorkerLoad.from_load(engine.load, engine.num_finished)

    registry = worker_registry(model_name, read)
    servicer.histograms = EngineHistograms(model_name, registry)  # handed to the engine once loaded
    return serve_metrics(registry, port, host)
