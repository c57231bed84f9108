"""User-facing configuration of the OpenAI-compatible HTTP gateway (GatewayConfig).

A frozen dataclass that validates itself; nanoserve.config turns its fields into
`nanoserve gateway` flags (env NANOSERVE_GATEWAY_<FIELD>).
"""

from dataclasses import dataclass, field
from typing import ClassVar

from nanoserve.service_config import ServiceConfig, at_least, positive
from nanoserve.wire import MAX_STREAM_INTERVAL


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig(ServiceConfig):
    """nanoserve gateway: the OpenAI HTTP API (/v1/completions, /v1/chat/completions, /v1/models)
    in front of a frontend's gRPC API. Callers' bearer tokens are forwarded to the frontend."""

    env_prefix: ClassVar[str] = "NANOSERVE_GATEWAY_"

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

    def __post_init__(self) -> None:
        ServiceConfig.__post_init__(self)
        host, sep, port = self.frontend_address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"frontend_address must be host:port, got {self.frontend_address!r}")
        at_least(self, 1, "frontend_connections")
        at_least(self, 1024, "max_body_bytes")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(
                f"stream_interval must be in [1, {MAX_STREAM_INTERVAL}], got {self.stream_interval}"
            )
        positive(self, "header_timeout_s", "keep_alive_timeout_s")
        at_least(self, 0, "request_timeout_s")
        if (self.tls_client_cert_file is None) != (self.tls_client_key_file is None):
            raise ValueError("tls_client_cert_file and tls_client_key_file go together")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be blank")

    @property
    def root_certificates(self) -> str | bool | None:
        """What AsyncClient's root_certificates= takes: a PEM path, True (system roots) or None."""
        if self.tls_root_certificates_file is not None:
            return self.tls_root_certificates_file
        if self.tls_system_roots or self.tls_client_cert_file is not None:
            return True
        return None
