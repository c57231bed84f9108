"""The fields every nanoserve service process has (ServiceConfig), and the range checks configs share.

WorkerConfig, FrontendConfig and GatewayConfig extend ServiceConfig; nanoserve.config turns all of
their fields into flags. Its fields are keyword-only, so that a subclass may add required ones.
"""

from dataclasses import dataclass, field

from nanoserve.grpc_options import DEFAULT_MAX_MESSAGE_BYTES
from nanoserve.log import check_log_format, parse_level
from nanoserve.tracing import TRACES_HELP

PORT_HELP = "port to bind (0 = any free port)"


def at_least(config: object, minimum: float, *names: str) -> None:
    """ValueError naming the first field of `names` below `minimum` (NaN included)."""
    for name in names:
        value = getattr(config, name)
        if not value >= minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")


def positive(config: object, *names: str) -> None:
    """ValueError naming the first field of `names` that is not > 0 (NaN included)."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def one_of(config: object, name: str, choices: tuple[str, ...]) -> None:
    if getattr(config, name) not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(choices)}; got {getattr(config, name)!r}"
        )


# Not slotted (slots=True is for the subclasses): WorkerConfig also extends the slotted EngineConfig,
# and two slotted bases would not share one instance layout.
@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": PORT_HELP})  # each service names its own
    grace_period_s: float = field(
        default=30.0,
        metadata={"help": "on SIGTERM, how long in-flight requests may run before they are cut"},
    )
    max_message_bytes: int = field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metadata={"help": "largest gRPC message, either direction"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    log_format: str = field(
        default="text", metadata={"help": "request log lines: text or json (one object a line)"}
    )
    metrics_port: int = field(
        default=0, metadata={"help": "port of the Prometheus /metrics HTTP endpoint (0 = off)"}
    )
    otlp_traces_endpoint: str = field(default="", metadata={"help": TRACES_HELP})
    tls_cert_file: str | None = field(
        default=None, metadata={"help": "PEM certificate chain: serve TLS (with tls_key_file)"}
    )
    tls_key_file: str | None = field(
        default=None, metadata={"help": "PEM private key of tls_cert_file"}
    )
    tls_client_ca_file: str | None = field(
        default=None,
        metadata={
            "help": "PEM CA bundle: require callers to present a client certificate it signed "
            "(mutual TLS)"
        },
    )

    def __post_init__(self) -> None:
        for name in ("port", "metrics_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"metrics_port and port must differ, both are {self.port}")
        at_least(self, 0, "grace_period_s")
        at_least(self, 1024, "max_message_bytes")
        parse_level(self.log_level)
        check_log_format(self.log_format)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
