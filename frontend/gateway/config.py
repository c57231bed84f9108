"""User-facing configuration of the OpenAI-compatible HTTP gateway (GatewayConfig).

A frozen dataclass that validates itself; nanoserve.config turns its fields into
`nanoserve gateway` flags (env NANOSERVE_GATEWAY_<FIELD>).
"""

from dataclasses import dataclass, field
from typing import ClassVar

from nanoserve.grpc_options import DEFAULT_MAX_MESSAGE_BYTES
from nanoserve.log import check_log_format, parse_level
from nanoserve.tracing import TRACES_HELP
from nanoserve.wire import MAX_STREAM_INTERVAL


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """nanoserve gateway: the OpenAI HTTP API (/v1/completions, /v1/chat/completions, /v1/models)
    in front of a frontend's gRPC API. Callers' bearer tokens are forwarded to the frontend."""

    env_prefix: ClassVar[str] = "NANOSERVE_GATEWAY_"

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=8000, metadata={"help": "HTTP port to bind (0 = any free port)"})
    reuse_port: bool = field(
        default=False,
        metadata={
            "help": "bind with SO_REUSEPORT, so that several gateway processes share the port (the "
            "kernel spreads connections over them; one process's HTTP/SSE work is the bound near "
            "15k streamed tokens/s). Give each its own --metrics-port"
        },
    )
    frontend_address: str = field(
        default="127.0.0.1:50051", metadata={"help": "host:port of the frontend's gRPC API"}
    )
    frontend_connections: int = field(
        default=4,
        metadata={
            "help": "connections to the frontend, requests dealt round-robin over them: several "
            "frontend processes on one port (SO_REUSEPORT) each get a share of every gateway"
        },
    )
    served_model_name: str | None = field(
        default=None,
        metadata={
            "help": "the model name of /v1/models and the one requests must name (default: the "
            "frontend's model name)"
        },
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "largest request body, in bytes; larger ones get 413"},
    )
    max_message_bytes: int = field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metadata={"help": "largest gRPC message to or from the frontend"},
    )
    request_timeout_s: float = field(
        default=0.0,
        metadata={"help": "deadline in seconds of each call to the frontend (0 = none)"},
    )
    # ---- reaching a TLS frontend (shared/security.py channel_credentials) ----
    tls_root_certificates_file: str | None = field(
        default=None,
        metadata={"help": "PEM CA bundle that signed the frontend's certificate: dial with TLS"},
    )
    tls_system_roots: bool = field(
        default=False,
        metadata={"help": "dial the frontend with TLS, trusting the system's CA roots"},
    )
    tls_client_cert_file: str | None = field(
        default=None,
        metadata={"help": "PEM client certificate for a frontend that requires mutual TLS"},
    )
    tls_client_key_file: str | None = field(
        default=None, metadata={"help": "PEM private key of tls_client_cert_file"}
    )
    stream_interval: int = field(
        default=1,
        metadata={
            "help": "streamed replies: after the first token, one server-sent event per this many "
            "tokens (the gRPC request's stream_interval; fewer, bigger events cost the gateway "
            "less per token). Whole replies always ask the frontend for its largest interval"
        },
    )
    grace_period_s: float = field(
        default=30.0,
        metadata={"help": "on SIGTERM, how long in-flight requests may run before they are cut"},
    )
    header_timeout_s: float = field(
        default=10.0,
        metadata={
            "help": "a connection whose next request's headers are not complete this many seconds "
            "after it opened (or after its previous response) is closed: slow-header clients "
            "hold no connection longer"
        },
    )
    keep_alive_timeout_s: float = field(
        default=5.0,
        metadata={"help": "an idle keep-alive connection is closed after this many seconds"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    log_format: str = field(
        default="text", metadata={"help": "request log lines: text or json (one object a line)"}
    )
    metrics_port: int = field(
        default=0, metadata={"help": "port of the Prometheus /metrics HTTP endpoint (0 = off)"}
    )
    otlp_traces_endpoint: str = field(default="", metadata={"help": TRACES_HELP})

    def __post_init__(self) -> None:
        for name in ("port", "metrics_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        check_log_format(self.log_format)
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"metrics_port and port must differ, both are {self.port}")
        host, sep, port = self.frontend_address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"frontend_address must be host:port, got {self.frontend_address!r}")
        if self.frontend_connections < 1:
            raise ValueError(f"frontend_connections must be >= 1, got {self.frontend_connections}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(
                f"stream_interval must be in [1, {MAX_STREAM_INTERVAL}], got {self.stream_interval}"
            )
        for name in ("header_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("request_timeout_s", "grace_period_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if (self.tls_client_cert_file is None) != (self.tls_client_key_file is None):
            raise ValueError("tls_client_cert_file and tls_client_key_file go together")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be blank")
        parse_level(self.log_level)

    @property
    def root_certificates(self) -> str | bool | None:
        """What AsyncClient's root_certificates= takes: a PEM path, True (system roots) or None."""
        if self.tls_root_certificates_file is not None:
            return self.tls_root_certificates_file
        if self.tls_system_roots or self.tls_client_cert_file is not None:
            return True
        return None
