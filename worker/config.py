"""User-facing configuration of the engine (EngineConfig) and of the worker service (WorkerConfig).

Frozen dataclasses that validate themselves; nanoserve.config turns their fields into CLI flags
(env NANOSERVE_WORKER_<FIELD>). Values derived at run time (KV block count, eos ids, the model's own
config) live on the objects that compute them.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from nanoserve.model_files import MODEL_HELP, REVISION_HELP, check_model_name
from nanoserve.sampling import DEFAULT_MAX_STOP_TOKEN_IDS
from nanoserve.service_config import PORT_HELP, ServiceConfig, at_least, one_of, positive

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
    decode_fusions: bool = field(
        default=False,
        metadata={
            "help": "Triton backend: a decode step's q/k norms, rotary and KV store inside the "
            "decode attention; at one rank also a one-row step's RMSNorms inside the GEMVs after "
            "them and the MLP's SiLU inside gate_up (off: on the H100 they made batch-1 decode "
            "slower, 1.06 -> 1.19 ms/token)"
        },
    )
    lookahead_prompts: bool | None = field(
        default=None,
        metadata={
            "help": "with decode lookahead: also forward ahead a step that admits prompts (a mixed "
            "step) and the step after a prefill, scheduled one step early (default: on where "
            "--decode-lookahead is left unset, so on cuda, at tensor_parallel_size 1; tp > 1 has "
            "not run it on GPUs yet)"
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
            "a bucket and run as one CUDA graph each (0: eager prefill, unpadded)"
        },
    )
    prefill_sdpa_min_tokens: int = field(
        default=1024,
        metadata={
            "help": "cuda + triton attention, one rank, a bf16/fp16 cache: a prefill step of one "
            "prompt with nothing cached and at least this many tokens attends with torch's SDPA "
            "(cuDNN on Hopper: TTFT of a 4,000-token prompt 12.8-13.3 ms against the Triton "
            "kernel's 14.7 on an H100, top-1 agreement 0.998); each prefill bucket from it up to "
            "the one a max_model_len prompt pads to gets a second CUDA graph for such steps at "
            "start-up (Qwen3-0.6B on an H100: ~60 MiB and 1.3-1.6 s more start-up; 0: off, the "
            "Triton kernel for every step)"
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
        one_of(self, "device", ("auto", "cpu", "cuda"))
        one_of(self, "dtype", DTYPES)
        at_least(self, 1, "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens")
        at_least(self, 0, "max_prefill_tokens_while_decoding", "max_model_len")
        at_least(self, 0, "prefill_graph_max_tokens", "prefill_sdpa_min_tokens")
        bs = self.kvcache_block_size
        if bs < 1 or bs & (bs - 1):
            raise ValueError(f"kvcache_block_size must be a power of two, got {bs}")
        if self.num_kvcache_blocks is not None:
            at_least(self, 1, "num_kvcache_blocks")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        positive(self, "cpu_kvcache_gib")
        one_of(self, "kv_cache_dtype", ("auto", "fp8"))
        one_of(self, "load_format", ("auto", "dummy"))
        one_of(self, "attention_backend", ("auto", "torch", "triton", "flash_attn"))

    def plans_prompts_ahead(self) -> bool:
        """lookahead_prompts resolved: unset, on with decode lookahead's own default (CUDA) at one
        rank. It acts only where decode lookahead is on. On the H200 it cut the Poisson ITL
        p99/p50 from 2.34-2.41 to 2.00-2.03 (docs/benchmarks.md, 2026-12-05)."""
        if self.lookahead_prompts is not None:
            return self.lookahead_prompts
        return self.decode_lookahead is None and self.tensor_parallel_size == 1


# --engine-core-cpus (worker.core.cpu_affinity applies it)
MAX_SPEC_CHARS = 256
MAX_CPU = 8191  # x86-64 Linux's largest CONFIG_NR_CPUS: bounds what one spec can name


def parse_cpu_list(spec: str) -> frozenset[int]:
    """`3`, `2-3`, `0,4-5` (Linux's cpu-list syntax) -> the CPUs; ValueError naming the flag."""
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"engine_core_cpus: at most {MAX_SPEC_CHARS} characters")
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(
                f"engine_core_cpus: {part.strip()!r} is not a CPU or a range like 2-3"
            ) from None
        if not 0 <= first <= last <= MAX_CPU:
            raise ValueError(
                f"engine_core_cpus: {part.strip()!r} is not a range of CPUs 0-{MAX_CPU}"
            )
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig(EngineConfig, ServiceConfig):
    """nanoserve worker: scheduler, paged KV cache and Qwen3 model behind WorkerService (gRPC)."""

    env_prefix: ClassVar[str] = "NANOSERVE_WORKER_"

    model: str = field(metadata={"help": MODEL_HELP})  # required here: no silent random weights
    revision: str | None = field(default=None, metadata={"help": REVISION_HELP})
    port: int = field(default=50061, metadata={"help": PORT_HELP})
    max_queued_requests: int = field(
        default=4096,
        metadata={
            "help": "requests running + waiting before the worker answers RESOURCE_EXHAUSTED"
        },
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
    engine_core_cpus: str = field(
        default="",
        metadata={
            "help": "CPUs (a list like 3 or 2-3) for the engine core's step loop alone: the "
            "worker's other threads and processes keep off them. The step loop spins while it "
            "waits for the GPU, so a thread the kernel wakes beside it takes time from it; give "
            "the frontends the other CPUs too (nanoserve serve does; else taskset, a container's "
            "cpuset). Empty: the OS places every thread"
        },
    )
    # ---- operating it: hostile-list bounds ----
    max_stop_token_ids: int = field(
        default=DEFAULT_MAX_STOP_TOKEN_IDS, metadata={"help": "most stop token ids per request"}
    )
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

    def __post_init__(self):
        EngineConfig.__post_init__(self)
        ServiceConfig.__post_init__(self)
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
        at_least(self, 0, "max_stop_token_ids", "engine_stall_timeout_s", "stats_interval_s")
        at_least(self, 1, "max_queued_requests")
        if self.engine_core_cpus:
            parse_cpu_list(self.engine_core_cpus)  # raises ValueError naming the flag
