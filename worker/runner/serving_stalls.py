"""What stalls the engine core's steps once it serves, logged as it happens: a Triton kernel
specialised (compiled, or loaded from the disk cache: the runner's start-up should have done them
all) and a garbage-collector pass that held the process. run_engine_core installs it once the
engine is ready (the start-up compiles on purpose before that); `bench arrivals` and the runner's
StartClock count the same two through `watch_stalls`."""

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

SLOW_GC_MS = 20.0  # a pass this long holds every running stream's next token as long


def watch_stalls(
    on_specialise: Callable[[str], None], on_gc: Callable[[float, dict[str, Any]], None]
) -> Callable[[], None]:
    """Calls on_specialise(kernel) before each new Triton specialisation (the hook installed
    before still runs) and on_gc(ms, info) after each GC pass; returns what removes both."""
    gc_start = 0.0

    def gc_callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal gc_start
        if phase == "start":
            gc_start = time.perf_counter()
        else:
            on_gc((time.perf_counter() - gc_start) * 1e3, info)

    gc.callbacks.append(gc_callback)
    knobs = _triton_runtime_knobs()
    previous = knobs.jit_cache_hook if knobs is not None else None

    def hook(*args: Any, **kwargs: Any) -> Any:
        on_specialise(specialisation(str(kwargs.get("repr", "?"))))
        return previous(*args, **kwargs) if previous is not None else None

    if knobs is not None:
        knobs.jit_cache_hook = hook

    def uninstall() -> None:
        gc.callbacks.remove(gc_callback)
        if knobs is not None and knobs.jit_cache_hook is hook:
            knobs.jit_cache_hook = previous

    return uninstall


def specialisation(triton_repr: str, limit: int = 600) -> str:
    """Triton's `name[options](arg: (type, spec), ...)` as `name(arg: (type, spec), ...)`: the
    options are the same for every launch of a kernel, the arguments' types and specialisations
    (D: divisible by 16) say which launch was new."""
    name, _, rest = triton_repr.partition("[")
    _, found, args = rest.partition("](")
    return (f"{name}({args}" if found else triton_repr)[:limit]


def log_serving_stalls(slow_gc_ms: float = SLOW_GC_MS) -> Callable[[], None]:
    """Each specialisation, and each GC pass of at least slow_gc_ms, as a warning."""

    def on_specialise(kernel: str) -> None:
        logger.warning(
            "a Triton kernel was specialised while serving (compiled, or loaded from the disk "
            "cache; the step waited for it): %s",
            kernel,
        )

    def on_gc(ms: float, info: dict[str, Any]) -> None:
        if ms >= slow_gc_ms:
            logger.warning(
                "a garbage-collector pass (generation %d, %d collected) held the engine core "
                "%.1f ms",
                info.get("generation", -1),
                info.get("collected", 0),
                ms,
            )

    return watch_stalls(on_specialise, on_gc)


def _triton_runtime_knobs() -> Any:
    """triton.knobs.runtime, or None where Triton (or that knob) is missing."""
    try:
        import triton
    except ImportError:
        return None
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return runtime if hasattr(runtime, "jit_cache_hook") else None
