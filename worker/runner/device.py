"""Where a ModelRunner runs: its device, dtype and attention backend resolved from the config's
"auto" values, and random weights for benchmarks without a checkpoint.
"""

import importlib
import threading
from collections.abc import Callable

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def device_memory_used(device: torch.device) -> int:
    """Bytes held on a CUDA device by every allocator (graph pools too), after its queued work and
    with the caching allocator's free blocks given back first: torch.cuda.graph gives them back
    when a capture starts, so a delta across captures would count them as freed (-332 MiB in
    `benchmarks.prefill`, 2026-12-04); 0 elsewhere."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def prehash_triton() -> Callable[[], None]:
    """Triton keys its kernel cache by a sha256 of its own sources and libtriton (~420 MiB read:
    0.3 s of an H100 host's start-up, 2026-12-06), once a process, when the first kernel is
    launched. This starts that hash in a thread (file reads and hashlib release the GIL) while the
    device, model and weights come up, and returns the join to call before the first kernel."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # another Triton's layout: it hashes on first use, as before
        return lambda: None
    thread = threading.Thread(target=triton_key, name="triton-key", daemon=True)
    thread.start()
    return thread.join


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[dtype]


def resolve_attention_backend(backend: str, device: torch.device, block_size: int) -> str:
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend in ("triton", "flash_attn") and device.type != "cuda":
        raise ValueError(f"attention_backend: {backend} needs device cuda")
    if backend == "flash_attn":
        try:
            importlib.import_module("flash_attn")
        except ImportError as e:
            raise ValueError(f"attention_backend: flash_attn does not import ({e})") from None
        if block_size % 256:
            raise ValueError("attention_backend: flash_attn needs kvcache_block_size % 256 == 0")
    return backend


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Random weights of a sane scale (benchmarks without a checkpoint)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
