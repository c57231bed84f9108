"""User-facing configuration of the frontend service (FrontendConfig).

A frozen dataclass that validates itself; nanoserve.config turns its fields into
`python -m nanoserve.frontend` flags (env NANOSERVE_FRONTEND_<FIELD>). Model limits (max_model_len,
vocab_size) are not here: the worker reports them.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from nanoserve.frontend.admission import DEFAULT_MAX_CHAT_MESSAGES
from nanoserve.grpc_options import DEFAULT_HANDSHAKE_TIMEOUT_S
from nanoserve.model_files import REVISION_HELP, check_model_name
from nanoserve.sampling import DEFAULT_MAX_STOP_TOKEN_IDS
from nanoserve.service_config import PORT_HELP, ServiceConfig, at_least, one_of, positive

# Processes sharing a port each take whole connections (the kernel hashes them), so a client with
# one channel loads one process. Asked to reconnect this often, its calls spread over the
# processes: a stream of ~2 s then overlaps ~5 connections, at a reconnect (~1 ms of CPU, one
# handshake's wait for the call that opens it) per half second. Only where the kernel moves the
# connections queued on a stopping process's socket to another (frontend.server.connection_age_s).
REUSE_PORT_MAX_AGE_S = 0.5


def parse_worker_address(worker_address: str) -> list[tuple[str, int]]:
    """'a:1,b:2,[::1]:3' -> [(host, port)]; raises ValueError naming the bad entry."""
    targets = []
    for entry in worker_address.split(","):
        host, sep, port = entry.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"worker_address: {entry.strip()!r} is not host:port")
        targets.append((host, int(port)))
    return targets


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontendConfig(ServiceConfig):
    """nanoserve frontend: validates, admits, tokenizes requests; streams text from the worker."""

    env_prefix: ClassVar[str] = "NANOSERVE_FRONTEND_"

    model: str = field(
        metadata={
            "help": "model directory holding tokenizer.json and tokenizer_config.json, the "
            "same files as the worker's (a directory or a hub id, as for the worker), or `tiny` "
            "(the embedded test model)"
        },
    )
    revision: str | None = field(default=None, metadata={"help": REVISION_HELP})
    port: int = field(default=50051, metadata={"help": PORT_HELP})
    worker_address: str = field(
        default="127.0.0.1:50061",
        metadata={
            "help": "host:port of the workers' WorkerService: several comma-separated, or a DNS "
            "name that resolves to many (a scaled compose service, a Kubernetes headless Service)"
        },
    )
    worker_resolve_interval_s: float = field(
        default=5.0,
        metadata={"help": "how often worker host names are resolved again (workers come and go)"},
    )
    worker_poll_interval_s: float = field(
        default=0.25,
        metadata={
            "help": "how often each worker's load and state are asked (GetLoad) while no Session "
            "stream reports them"
        },
    )
    route_prefix_tokens: int = field(
        default=256,
        metadata={
            "help": "prompts sharing their first this-many tokens (whole KV blocks) go to the "
            "same worker, where that prefix is cached"
        },
    )
    route_max_queue_gap: int = field(
        default=8,
        metadata={
            "help": "a request leaves its prefix's worker when that worker's queue exceeds the "
            "least-loaded worker's by more than this many requests and route_max_queue_ratio"
        },
    )
    route_max_queue_ratio: float = field(
        default=2.0, metadata={"help": "see route_max_queue_gap (a ratio of queue lengths)"}
    )
    connection_idle_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "a client connection with no call for this many seconds is closed (a GOAWAY: "
            "a client reconnects at its next call); 0 = never"
        },
    )
    max_connection_age_s: float | None = field(
        default=None,
        metadata={
            "help": "a client connection this many seconds old is asked (a GOAWAY) to make its "
            "next calls on a new connection; its calls in flight finish on the old one. With "
            "--reuse-port the kernel hands each new connection to one of the processes, so one "
            "client channel's calls spread over them instead of loading one; 0 = never "
            f"(default: {REUSE_PORT_MAX_AGE_S} s with --reuse-port where the kernel hands the "
            "connections queued on a stopping process to the others (sysctl "
            "net.ipv4.tcp_migrate_req = 1), else never: without it, a reconnect that lands on a "
            "process in a rolling restart may be reset)"
        },
    )
    handshake_timeout_s: float = field(
        default=DEFAULT_HANDSHAKE_TIMEOUT_S,
        metadata={
            "help": "a connection that has not completed its HTTP/2 (and TLS) handshake this many "
            "seconds after it opened is closed"
        },
    )
    max_concurrent_requests: int = field(
        default=1024,
        metadata={"help": "in-flight Generate/Chat calls before new ones get RESOURCE_EXHAUSTED"},
    )
    max_stop_strings: int = field(default=16, metadata={"help": "most stop strings per request"})
    max_stop_string_length: int = field(
        default=256, metadata={"help": "longest stop string, in characters"}
    )
    max_prompt_bytes: int = field(
        default=4 * 1024 * 1024,
        metadata={"help": "largest prompt (or sum of chat message contents), in UTF-8 bytes"},
    )
    # No deadline of our own by default (as vLLM): a long generation the client waits for is not cut.
    request_timeout_s: float = field(
        default=0.0,
        metadata={"help": "deadline in seconds for calls whose client set none (0 = none)"},
    )
    worker_connect_timeout_s: float = field(
        default=1.0,
        metadata={"help": "how long a request waits for the worker connection before UNAVAILABLE"},
    )
    stream_interval: int = field(
        default=1,
        metadata={
            "help": "after the first token, send a client a message once this many new tokens "
            "wait (1 = every engine step; larger = fewer, bigger messages)"
        },
    )
    allow_special_tokens_in_messages: bool = field(
        default=False,
        metadata={
            "help": "special-token text in chat messages (`<|im_start|>` typed by a user) becomes "
            "the control token, as in vLLM; off (the default), it stays text and only the chat "
            "template writes control tokens"
        },
    )
    coalesce_max_ids: int = field(
        default=8,
        metadata={
            "help": "while this process's event loop is near a full core, a stream's next message "
            "waits for up to this many new ids (its CPU is then spent per message, not per token, "
            "instead of falling behind the engine); 1 = never coalesce"
        },
    )
    # Entries with texts (20 alternatives, 64-byte token texts at worst): an alternative is ~77
    # bytes (id 1+3, logprob 1+4, text 2+64, header 2), an entry 20 * 77 + ~80 ≈ 1.6 KB, so 1,024
    # entries ≈ 1.7 MB worst case (≈ 0.4 MB with Qwen3's typical 4-8 byte texts): under the 4 MiB
    # most clients accept (grpcurl, Node, Go), where one message of a 40K-token prompt is ~10 MB+.
    max_logprobs_per_message: int = field(
        default=1024,
        metadata={
            "help": "the most logprob entries (prompt and output together) one response message "
            "carries; more are sent in several messages"
        },
    )
    reuse_port: bool = field(
        default=False,
        metadata={
            "help": "bind with SO_REUSEPORT, so that several frontend processes share the port "
            "(the kernel spreads connections; each process holds its own session to the worker)"
        },
    )
    tokenizer_threads: int = field(
        default=4, metadata={"help": "threads that run tokenizer encode/decode off the event loop"}
    )
    enable_reflection: bool = field(
        default=True, metadata={"help": "serve gRPC reflection (for grpcurl)"}
    )
    # ---- operating it in public: hostile-list bounds, TLS, tokens, metrics, request logs ----
    max_stop_token_ids: int = field(
        default=DEFAULT_MAX_STOP_TOKEN_IDS, metadata={"help": "most stop token ids per request"}
    )
    max_chat_messages: int = field(
        default=DEFAULT_MAX_CHAT_MESSAGES, metadata={"help": "most messages in one Chat request"}
    )
    api_keys_file: str | None = field(
        default=None,
        metadata={
            "help": "file of accepted bearer tokens, `KEY` or `TENANT KEY` a line; with this or "
            "api_keys set, calls need `authorization: Bearer KEY` (health stays open)"
        },
    )
    api_keys: str | None = field(
        default=None,
        metadata={"help": "comma-separated accepted bearer tokens (prefer the env variable)"},
    )
    worker_tls_ca_file: str | None = field(
        default=None,
        metadata={
            "help": "PEM CA bundle that signed the worker's certificate: connect to the worker "
            "over TLS (the worker's --tls-cert-file must name worker_address's host)"
        },
    )
    worker_tls_client_cert_file: str | None = field(
        default=None,
        metadata={
            "help": "PEM certificate chain the frontend presents to the worker (mutual TLS; "
            "with worker_tls_client_key_file and worker_tls_ca_file)"
        },
    )
    worker_tls_client_key_file: str | None = field(
        default=None, metadata={"help": "PEM private key of worker_tls_client_cert_file"}
    )
    worker_auth_token_file: str | None = field(
        default=None,
        metadata={
            "help": "file holding the worker link's secret (the workers' --auth-token-file, or "
            "one KEY of it): sent as `authorization: Bearer KEY` on every worker call"
        },
    )
    cache_salt_key_file: str | None = field(
        default=None,
        metadata={
            "help": "file holding the key of the tenants' prefix-cache salts (HMAC-SHA256 of the "
            "tenant name): every frontend of the same workers needs the same one; unset: the "
            "worker auth token, else a random key of this process"
        },
    )
    cache_isolation: str = field(
        default="tenant",
        metadata={
            "help": "tenant: with api keys, each tenant's prompts get their own prefix-cache "
            "blocks (a tenant cannot time another's prompts through TTFT); none: one cache "
            "shared by all callers. Without api keys there is one tenant"
        },
    )

    def __post_init__(self) -> None:
        ServiceConfig.__post_init__(self)
        check_model_name(self.model)
        parse_worker_address(self.worker_address)
        positive(self, "worker_resolve_interval_s", "worker_poll_interval_s")
        positive(self, "worker_connect_timeout_s", "handshake_timeout_s")
        at_least(self, 1, "route_prefix_tokens", "route_max_queue_ratio")
        at_least(self, 0, "route_max_queue_gap", "max_stop_strings", "request_timeout_s")
        at_least(self, 0, "max_stop_token_ids", "max_chat_messages", "connection_idle_timeout_s")
        at_least(self, 1, "max_concurrent_requests", "max_stop_string_length", "max_prompt_bytes")
        at_least(self, 1, "tokenizer_threads", "stream_interval", "coalesce_max_ids")
        at_least(self, 1, "max_logprobs_per_message")
        if self.max_connection_age_s is not None:
            at_least(self, 0, "max_connection_age_s")
        if (self.worker_tls_client_cert_file is None) != (self.worker_tls_client_key_file is None):
            raise ValueError(
                "worker_tls_client_cert_file and worker_tls_client_key_file go together"
            )
        if self.worker_tls_client_cert_file is not None and self.worker_tls_ca_file is None:
            raise ValueError("worker_tls_client_cert_file needs worker_tls_ca_file")
        one_of(self, "cache_isolation", ("tenant", "none"))
