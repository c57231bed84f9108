"""FrontendServer: the frontend process's wiring around FrontendServicer (frontend.servicer): the
worker pool, gRPC health following the pool, reflection, TLS and API keys, /metrics, and graceful
shutdown.
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from nanoserve.frontend.config import REUSE_PORT_MAX_AGE_S, FrontendConfig
from nanoserve.frontend.health import HealthServicer
from nanoserve.frontend.request_log import RequestLog
from nanoserve.frontend.servicer import FrontendServicer
from nanoserve.frontend.workers.pool import WorkerPool
from nanoserve.frontend.workers.routing import BalanceRule
from nanoserve.grpc_options import server_options
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.security import (
    ServerSecurity,
    channel_credentials,
    read_secret,
    set_cache_salt_key,
)
from nanoserve.startup_heap import freeze_startup_heap
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.tracing import tracer_for

if TYPE_CHECKING:  # prometheus_client loads only with a metrics port
    from nanoserve.frontend.metrics import FrontendMetrics

logger = logging.getLogger(__name__)

SERVICE_NAME = frontend_pb2.DESCRIPTOR.services_by_name["FrontendService"].full_name
# A valid request is its prompt (<= max_prompt_bytes) plus at most this much: ids within
# max_model_len, bounded stop lists, parameters. Larger ones are refused before they are parsed.
REQUEST_OVERHEAD_BYTES = 1024 * 1024
# 1: a listening socket that closes hands the connections queued on it (accepted by the kernel, not
# yet by gRPC) to another socket of its SO_REUSEPORT group; 0 (Linux's default): they are reset
TCP_MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def connection_age_s(config: FrontendConfig, migrate_req: Path = TCP_MIGRATE_REQ) -> float:
    """config.max_connection_age_s, its default resolved: seconds, 0 = never. Aged connections
    reconnect all the time, so without migration a rolling restart would reset the few that land
    on the stopping process just as it closes its socket (a failed call each, UNAVAILABLE)."""
    if config.max_connection_age_s is not None:
        return config.max_connection_age_s
    if not config.reuse_port:
        return 0.0
    try:
        migrates = migrate_req.read_text().strip() == "1"
    except OSError:  # not Linux, or a kernel before 5.14
        migrates = False
    return REUSE_PORT_MAX_AGE_S if migrates else 0.0


class FrontendServer:
    """The frontend's grpc.aio server: FrontendService, health, reflection, and the worker link."""

    def __init__(self, config: FrontendConfig, model_dir: str, tokenizer: Tokenizer | None = None):
        self.config = config
        self._owns_tokenizer = tokenizer is None
        self.tokenizer = tokenizer or Tokenizer(
            model_dir, config.tokenizer_threads, config.allow_special_tokens_in_messages
        )
        self.health = HealthServicer(ends_watches=config.reuse_port)
        worker_token = read_secret(config.worker_auth_token_file)
        set_cache_salt_key(read_secret(config.cache_salt_key_file) or worker_token)
        self.pool = WorkerPool(
            config.worker_address,
            tokenizer_digest(model_dir),
            self._on_worker_ready,
            connect_timeout_s=config.worker_connect_timeout_s,
            max_message_bytes=config.max_message_bytes,
            resolve_interval_s=config.worker_resolve_interval_s,
            poll_interval_s=config.worker_poll_interval_s,
            prefix_tokens=config.route_prefix_tokens,
            rule=BalanceRule(config.route_max_queue_gap, config.route_max_queue_ratio),
            credentials=channel_credentials(
                config.worker_tls_ca_file,
                config.worker_tls_client_cert_file,
                config.worker_tls_client_key_file,
            ),
            token=worker_token,
        )
        self.servicer = FrontendServicer(config, self.tokenizer, self.pool)
        self.servicer.request_sinks.append(RequestLog(config.log_format))
        self.tracer = tracer_for("nanoserve-frontend", config.otlp_traces_endpoint)
        if self.tracer is not None:  # the OpenTelemetry SDK is imported only then
            from nanoserve.frontend.request_trace import RequestTracer

            self.servicer.tracer = self.tracer
            self.servicer.request_sinks.append(RequestTracer(self.tracer))
        self.metrics: FrontendMetrics | None = None
        self.metrics_server: Any = None  # prometheus_client's HTTP server, when metrics_port is set
        if config.metrics_port:  # prometheus_client is imported (and paid for) only when asked for
            from nanoserve.frontend.metrics import FrontendMetrics as Metrics

            self.metrics = Metrics(Path(model_dir).name)
            self.metrics.track_in_flight(lambda: self.servicer.num_in_flight)
            # first of the sinks: counters move before the log line, so a reader of the line
            # who then scrapes sees the request counted
            self.servicer.request_sinks.insert(0, self.metrics.observe)
        self.security = ServerSecurity.load(
            config.tls_cert_file,
            config.tls_key_file,
            config.tls_client_ca_file,
            config.api_keys_file,
            config.api_keys,
        )
        age_s = connection_age_s(config)
        if config.reuse_port:
            logger.info(
                f"client connections reconnect every {age_s:.1f} s, spreading over the processes "
                "that share the port"
                if age_s
                else "client connections are not aged: each stays on the process it reached "
                "(--max-connection-age-s; its default needs net.ipv4.tcp_migrate_req = 1)"
            )
        options = server_options(
            config.max_message_bytes,
            config.connection_idle_timeout_s,
            config.handshake_timeout_s,
            age_s,
        )
        if config.reuse_port:  # several frontend processes on one port
            options = [o for o in options if o[0] != "grpc.so_reuseport"] + [
                ("grpc.so_reuseport", 1)
            ]
        self.server = grpc.aio.server(
            interceptors=self.security.interceptors(
                config.max_prompt_bytes + REQUEST_OVERHEAD_BYTES, "max_prompt_bytes + 1 MiB"
            ),
            options=options,
        )
        frontend_grpc.add_FrontendServiceServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if config.enable_reflection:
            reflection.enable_server_reflection(
                [
                    SERVICE_NAME,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ],
                self.server,
            )
        self.port: int | None = None

    async def _on_worker_ready(self, ready: bool) -> None:
        """Health follows the pool: SERVING while some worker takes requests (not draining)."""
        if self.servicer.draining:  # the frontend itself is stopping: stays NOT_SERVING
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def start(self) -> int:
        """Binds and starts serving (NOT_SERVING until the worker answers); returns the port."""
        await self._on_worker_ready(False)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        self.port = self.security.add_port(self.server, self.config.host, self.config.port)
        if self.port == 0:
            raise RuntimeError(f"could not bind {host}:{self.config.port}")
        await self.server.start()
        if self.config.metrics_port and self.metrics is not None:
            from nanoserve.metrics_endpoint import serve_metrics

            self.metrics_server = serve_metrics(
                self.metrics.registry, self.config.metrics_port, self.config.host
            )
        self.pool.start()
        logger.info("frontend listening on %s:%d", host, self.port)
        freeze_startup_heap("frontend")
        return self.port

    async def stop(self, grace: float = 0.0) -> None:
        """Drains: NOT_SERVING at once, calls in flight get `grace` seconds to finish, then the
        server stops and cuts what is left. New calls: a frontend alone on its port keeps listening
        and refuses them (UNAVAILABLE) while it drains; one sharing its port (--reuse-port) hands
        them over: gRPC's graceful stop closes its listening socket and sends every connection a
        GOAWAY, so clients open their next calls, on a new connection, on the other processes."""
        if self.config.reuse_port:
            await self.health.enter_graceful_shutdown()  # its Watch streams say so and end
            # gRPC's own count of the calls it took decides: one taken just before the GOAWAY
            # may not have reached the servicer's in-flight count yet
            await self.server.stop(grace)
        else:
            self.servicer.draining = True
            await self.health.enter_graceful_shutdown()
            deadline = time.monotonic() + grace
            # keep answering health checks (NOT_SERVING) while streams finish; server.stop()
            # would refuse them, and would wait out the whole grace period for open health Watch
            # streams (so it comes last, with what is left of the grace, at most a second)
            while self.servicer.num_in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await self.server.stop(min(1.0, max(0.0, deadline - time.monotonic())))
        await self.servicer.requests.pacer.stop()
        await self.pool.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        if self.tracer is not None:
            self.tracer.shutdown()
        if self._owns_tokenizer:
            self.tokenizer.close()
