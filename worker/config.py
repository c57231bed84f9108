"""User-facing configuration of the engine (EngineConfig) and of the worker service (WorkerConfig).

Frozen dataclasses that validate themselves; nanoserve.config turns their fields into CLI flags
(env NANOSERVE_WORKER_<FIELD>). Values derived at run time (KV block count, eos ids, the model's own
config) live on the objects that compute them.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from nanoserve.log import check_log_format
from nanoserve.model_files import MODEL_HELP, REVISION_HELP, check_model_name
from nanoserve.tracing import TRACES_HELP

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = field(default="", metadata={"help": "Hugging Face Qwen3 model directory"})
    device: str = field(
        default="auto", metadata={"help": "cpu, cuda or auto (cuda when available)"}
    )
    dtype: str = field(
        default="auto",
        metadata={"help": "auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16"},
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "ranks the model is split over"})
    enforce_eager: bool = field(default=False, metadata={"help": "never use CUDA graphs"})
    decode_lookahead: bool | None = field(
        default=None,
        metadata={
            "help": "forward decode step N+1 before step N's tokens reach the host (default: on "
            "cuda, off on cpu)"
        },
    )
    custom_all_reduce: bool = field(
        default=True,
        metadata={
            "help": "tensor parallelism on CUDA: small all-reduces through symmetric memory, not NCCL"
        },
    )
    max_num_seqs: int = field(default=256, metadata={"help": "max sequences in one batch"})
    max_num_batched_tokens: int = field(
        default=16384,
        metadata={"help": "max tokens in one prefill step (longer prompts are chunked)"},
    )
    max_prefill_tokens_while_decoding: int = field(
        default=0,
        metadata={
            "help": "prompt tokens a step may add while sequences decode (0: max_num_batched_tokens); "
            "smaller bounds the inter-token gap a burst of arrivals causes, at some TTFT"
        },
    )
    max_model_len: int = field(
        default=0,
        metadata={
            "help": "max prompt + completion tokens (0: the model's max_position_embeddings); "
            "capped by max_position_embeddings and lowered to what the KV cache holds"
        },
    )
    kvcache_block_size: int = field(default=256, metadata={"help": "tokens per KV-cache block"})
    num_kvcache_blocks: int | None = field(
        default=None, metadata={"help": "KV blocks to allocate (default: sized from memory)"}
    )
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "fraction of GPU memory the worker may use"}
    )
    cpu_kvcache_gib: float = field(default=1.0, metadata={"help": "KV-cache size on cpu, in GiB"})
    attention_backend: str = field(
        default="auto",
        metadata={"help": "auto (triton on cuda, torch on cpu), torch, triton or flash_attn"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the sampler for unseeded requests"})
    load_progress_bar: bool | None = field(
        default=None,
        metadata={
            "help": "a progress bar on stderr while the weights load (default: only when stderr "
            "is a terminal, so logs stay clean)"
        },
    )
    load_format: str = field(
        default="auto",
        metadata={"help": "auto (read the safetensors) or dummy (random weights: benchmarks)"},
    )
    prefill_graph_max_tokens: int = field(
        default=8192,
        metadata={
            "help": "cuda + triton attention: prefill steps of up to this many tokens are padded to "
            "a bucket and run through piecewise CUDA graphs (0: eager prefill, unpadded)"
        },
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "help": "auto (the model's dtype) or fp8 (float8 e4m3, per-tensor scale: half the KV "
            "bytes)"
        },
    )
    compile_cache_dir: str = field(
        default="",
        metadata={
            "help": "directory of the Triton kernel cache (TRITON_CACHE_DIR), kept across restarts "
            "(default: Triton's own, ~/.triton/cache)"
        },
    )

    def __post_init__(self):
        if self.model:
            check_model_name(self.model)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in (
            "tensor_parallel_size",
            "max_num_seqs",
            "max_num_batched_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prefill_tokens_while_decoding < 0:
            raise ValueError(
                "max_prefill_tokens_while_decoding must be >= 0 (0: max_num_batched_tokens), got "
                f"{self.max_prefill_tokens_while_decoding}"
            )
        if self.max_model_len < 0:
            raise ValueError(
                f"max_model_len must be >= 0 (0: from the model), got {self.max_model_len}"
            )
        bs = self.kvcache_block_size
        if bs < 1 or bs & (bs - 1):
            raise ValueError(f"kvcache_block_size must be a power of two, got {bs}")
        if self.num_kvcache_blocks is not None and self.num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1, got {self.num_kvcache_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.cpu_kvcache_gib <= 0:
            raise ValueError(f"cpu_kvcache_gib must be > 0, got {self.cpu_kvcache_gib}")
        if self.prefill_graph_max_tokens < 0:
            raise ValueError(
                f"prefill_graph_max_tokens must be >= 0, got {self.prefill_graph_max_tokens}"
            )
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_cache_dtype must be auto or fp8, got {self.kv_cache_dtype!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy, got {self.load_format!r}")
        if self.attention_backend not in ("auto", "torch", "triton", "flash_attn"):
            raise ValueError(
                "attention_backend must be auto, torch, triton or flash_attn, "
                f"got {self.attention_backend!r}"
            )


@dataclass(frozen=True, slots=True)
class WorkerConfig(EngineConfig):
    """nanoserve worker: scheduler, paged KV cache and Qwen3 model behind WorkerService (gRPC)."""

    env_prefix: ClassVar[str] = "NANOSERVE_WORKER_"

    model: str = field(metadata={"help": MODEL_HELP})  # required here: no silent random weights
    revision: str | None = field(default=None, metadata={"help": REVISION_HELP})
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=50061, metadata={"help": "port to bind (0 = any free port)"})
    max_queued_requests: int = field(
        default=4096,
        metadata={
            "help": "requests running + waiting before the worker answers RESOURCE_EXHAUSTED"
        },
    )
    grace_period_s: float = field(
        default=30.0,
        metadata={"help": "on SIGTERM, how long in-flight streams may run before they are cut"},
    )
    max_message_bytes: int = field(
        default=16 * 1024 * 1024, metadata={"help": "max gRPC message size"}
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    log_format: str = field(
        default="text", metadata={"help": "request log lines: text or json (one object a line)"}
    )
    stats_interval_s: float = field(
        default=10.0,
        metadata={
            "help": "seconds between the stats lines the worker logs while it has work (running, "
            "waiting, KV use, throughput, prefix hit rate); 0: off"
        },
    )
    engine_stall_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "an engine core that shows no progress (one step running, or no heartbeat) "
            "for half of this makes health NOT_SERVING, and for all of it makes the worker exit "
            "non-zero so that its supervisor restarts it; 0: never"
        },
    )
    # ---- operating it: hostile-list bounds and metrics ----
    max_stop_token_ids: int = field(
        default=128, metadata={"help": "most stop token ids per request"}
    )
    metrics_port: int = field(
        default=0, metadata={"help": "port of the Prometheus /metrics HTTP endpoint (0 = off)"}
    )
    otlp_traces_endpoint: str = field(default="", metadata={"help": TRACES_HELP})
    # ---- the frontend link: a shared secret and/or TLS, mutual with a client CA ----
    auth_token_file: str | None = field(
        default=None,
        metadata={
            "help": "file holding the worker link's secret (one line: KEY, or NAME KEY a line for "
            "several callers): every WorkerService call must carry `authorization: Bearer KEY` "
            "(health stays open); the frontends read it with --worker-auth-token-file"
        },
    )
    allow_unauthenticated: bool = field(
        default=False,
        metadata={
            "help": "serve a non-loopback address with neither auth_token_file nor "
            "tls_client_ca_file (anyone who reaches the port could run and abort requests)"
        },
    )
    tls_cert_file: str | None = field(
        default=None, metadata={"help": "PEM certificate chain: serve TLS (with tls_key_file)"}
    )
    tls_key_file: str | None = field(
        default=None, metadata={"help": "PEM private key of tls_cert_file"}
    )
    tls_client_ca_file: str | None = field(
        default=None,
        metadata={
            "help": "PEM CA bundle: require frontends to present a client certificate it signed "
            "(mutual TLS)"
        },
    )

    def __post_init__(self):
        super(WorkerConfig, self).__post_init__()
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        from nanoserve.security import is_loopback  # grpc: not for the offline engine's config

        if not (
            is_loopback(self.host)
            or self.auth_token_file
            or self.tls_client_ca_file
            or self.allow_unauthenticated
        ):
            raise ValueError(
                f"host {self.host} is not loopback: set auth_token_file (or tls_client_ca_file), "
                "or allow_unauthenticated to serve it open"
            )
        if self.max_stop_token_ids < 0:
            raise ValueError(f"max_stop_token_ids must be >= 0, got {self.max_stop_token_ids}")
        check_log_format(self.log_format)
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if not self.engine_stall_timeout_s >= 0:
            raise ValueError(
                f"engine_stall_timeout_s must be >= 0, got {self.engine_stall_timeout_s}"
            )
        if not self.stats_interval_s >= 0:
            raise ValueError(f"stats_interval_s must be >= 0, got {self.stats_interval_s}")
