"""Each service process calls `freeze_startup_heap` once it is ready to serve: what start-up left
alive (modules, the model's Python objects, the tokenizer) leaves the garbage collector's passes, so
a full pass while serving walks only what serving made. A full pass otherwise stalls every stream
of the process: 83-89 ms in the worker's (191k tracked objects), 8-10 ms in the frontend's (43k),
measured on the 2-core development machine; after the freeze, under 0.1 ms.
"""

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_startup_heap(service: str) -> None:
    """Collects once (start-up's garbage), then moves every object alive to the permanent
    generation (gc.freeze; vLLM's servers do the same after start-up)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.debug(
        "%s: %d objects frozen out of the garbage collector in %.0f ms",
        service,
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1e3,
    )
