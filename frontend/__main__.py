"""`python -m nanoserve.frontend --model DIR --worker-address HOST:PORT --port P`: runs the frontend
service until SIGTERM or SIGINT, then drains (NOT_SERVING, in-flight calls finish within the grace
period). A frontend that cannot start (no tokenizer.json, a busy port) says why in one line, exit 1.
"""

import asyncio
import dataclasses
import logging
import signal
import sys

from nanoserve.config import parse_config
from nanoserve.frontend.config import FrontendConfig
from nanoserve.log import log_startup_error, setup_logging
from nanoserve.model_files import check_tokenizer_files, resolve_model_dir
from nanoserve.process import check_port_free, die_with_starter

logger = logging.getLogger("nanoserve.frontend")


def preflight(config: FrontendConfig) -> FrontendConfig:
    """What can be checked before serving, fast: the model's tokenizer files and the port. Returns
    the config with `--model tiny` resolved to its directory; raises ValueError naming the fix."""
    config = dataclasses.replace(config, model=resolve_model_dir(config.model, config.revision))
    check_tokenizer_files(config.model)
    if not config.reuse_port:  # SO_REUSEPORT: sharing the port with other frontends is the point
        check_port_free(config.host, config.port)
    return config


async def serve(config: FrontendConfig) -> None:
    from nanoserve.frontend.server import FrontendServer  # tokenizers: the `frontend` extra

    server = FrontendServer(config, config.model)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info(
        "draining: %d requests in flight, grace %.1f s",
        server.servicer.num_in_flight,
        config.grace_period_s,
    )
    await server.stop(config.grace_period_s)
    logger.info("frontend stopped")


def main(argv: list[str] | None = None, prog: str = "python -m nanoserve.frontend") -> None:
    die_with_starter()  # (where `nanoserve serve` or a benchmark started this process)
    config = parse_config(FrontendConfig, argv, prog=prog)
    setup_logging("frontend", config.log_level)
    try:
        asyncio.run(serve(preflight(config)))
    except (ValueError, OSError) as e:  # an unusable model directory, a busy port and the like
        log_startup_error(logger, e)
        sys.exit(1)
    except ImportError as e:
        hint = "" if "nanoserve[" in str(e) else ": pip install 'nanoserve[frontend]'"
        log_startup_error(logger, ImportError(f"{e}{hint}"))
        sys.exit(1)


if __name__ == "__main__":
    main()
