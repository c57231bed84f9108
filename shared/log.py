"""Logging setup called once by each service's __main__: plain text lines, no colours.

Format: `2025-01-01 12:00:00,000 INFO [worker:r0] nanoserve.worker.service.server: message`.
"""

import logging
import sys

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


LOG_FORMATS = ("text", "json")  # of the request log lines (frontend and gateway)


def check_log_format(log_format: str) -> str:
    """`log_format` itself, or ValueError naming the field."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be text or json, got {log_format!r}")
    return log_format


def parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    if level.upper() not in _LEVELS:
        raise ValueError(f"log_level must be one of {_LEVELS}, got {level!r}")
    return getattr(logging, level.upper())


def setup_logging(service: str, level: str | int = "INFO", rank: int | None = None) -> None:
    """Routes the root logger to stdout (docker logs read it), the service name in each line.

    Tensor-parallel ranks above 0 log at WARNING or above only: rank 0 speaks for the worker.
    """
    tag = service if rank is None else f"{service}:r{rank}"
    numeric = parse_level(level)
    if rank is not None and rank > 0:
        numeric = max(numeric, logging.WARNING)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s [{tag}] %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # grpc's own Python loggers are chatty at DEBUG about connectivity; keep them at WARNING.
    logging.getLogger("grpc").setLevel(max(numeric, logging.WARNING))


def log_startup_error(logger: logging.Logger, error: BaseException) -> None:
    """A service that cannot start says why in one line; the traceback only at --log-level DEBUG."""
    logger.error("cannot start: %s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
