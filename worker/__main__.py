"""`python -m nanoserve.worker --model DIR`: start the WorkerService (flags generated from
WorkerConfig). A worker that cannot start (an unusable model, a busy port, no CUDA device) says why
in one line and exits 1; --log-level DEBUG adds the traceback.
"""

import asyncio
import dataclasses
import logging
import os

from nanoserve.config import parse_config
from nanoserve.log import log_startup_error, setup_logging
from nanoserve.model_files import TINY, check_model_dir, resolve_model_dir
from nanoserve.process import check_port_free, die_with_starter
from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.service.request_log import use_log_format

logger = logging.getLogger("nanoserve.worker")


def preflight(config: WorkerConfig) -> WorkerConfig:
    """Checks that need no torch and take no time, before the model loads: the model directory
    and the port. Returns the config with `--model tiny` resolved; raises ValueError."""
    if config.model == TINY:
        logger.warning(
            "--model tiny: random weights, its replies are gibberish (a test model); "
            "pass --model DIR with a Qwen3 checkpoint to serve a real one"
        )
    config = dataclasses.replace(config, model=resolve_model_dir(config.model, config.revision))
    check_model_dir(
        config.model, config.tensor_parallel_size, needs_weights=config.load_format != "dummy"
    )
    check_port_free(config.host, config.port)
    if config.engine_core_cpus:  # before any thread starts: they inherit it
        from nanoserve.worker.core.cpu_affinity import keep_process_off

        keep_process_off(config.engine_core_cpus)
    return config


def main(argv: list[str] | None = None, prog: str = "python -m nanoserve.worker") -> None:
    die_with_starter()  # (where `nanoserve serve` or a benchmark started this process)
    config = parse_config(WorkerConfig, argv, prog=prog)
    setup_logging("worker", config.log_level)
    use_log_format(config.log_format)
    try:
        config = preflight(config)
        from nanoserve.worker.service.server import serve

        code = asyncio.run(serve(config))
    except (ValueError, OSError, ImportError) as e:  # ImportError: no torch (`worker` extra)
        if isinstance(e, ImportError) and "nanoserve[" not in str(e):
            e = ImportError(f"{e}: the worker needs pip install 'nanoserve[worker]'")
        log_startup_error(logger, e)
        code = 1
    if code:  # exit now, whatever threads or tensor-parallel ranks are stuck (or still loading)
        logging.shutdown()
        os._exit(code)


if __name__ == "__main__":  # tensor-parallel ranks are spawned: they re-import this module
    main()
