"""--engine-core-cpus: CPUs of the engine core's step loop alone.

worker.__main__ keeps the gRPC process off them before it starts a thread (the engine core it spawns,
its pipe threads and its tensor-parallel ranks inherit that); run_engine_core then moves only its
step-loop thread onto them. Why: the step loop spins while it waits for the GPU (CUDA's default wait
on a host with more cores than GPUs), so a thread the kernel wakes beside it takes its CPU from it.
"""

import logging
import os

from nanoserve.worker.config import parse_cpu_list

logger = logging.getLogger(__name__)


def format_cpus(cpus: frozenset[int] | set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def keep_process_off(spec: str) -> frozenset[int]:
    """Moves the calling thread (the process's only one yet: call it before any thread starts)
    off the CPUs of `spec` (--engine-core-cpus); what it starts inherits that. Checks first that
    the kernel lets a thread onto them (a container's cpuset may not) and that some CPU is left.
    Returns the CPUs it keeps."""
    cpus = parse_cpu_list(spec)
    allowed = os.sched_getaffinity(0)
    rest = frozenset(allowed - cpus)
    if not rest:
        raise ValueError(
            f"engine_core_cpus {format_cpus(cpus)} takes every CPU this process may use "
            f"({format_cpus(allowed)}): leave some to the gRPC process"
        )
    try:
        os.sched_setaffinity(0, cpus)  # a trial: the engine core's step loop goes there
    except OSError as e:
        raise ValueError(
            f"engine_core_cpus {format_cpus(cpus)}: no thread may run there ({e.strerror})"
        ) from None
    os.sched_setaffinity(0, rest)
    return rest


def pin_step_loop(cpus: frozenset[int]) -> None:
    """The calling thread (the engine core's step loop) onto `cpus`; the threads already running
    (the pipe threads, CUDA's own) stay where they are."""
    os.sched_setaffinity(0, cpus)  # pid 0: on Linux the calling thread alone
    logger.info("the engine core's step loop runs on CPU %s alone", format_cpus(cpus))
