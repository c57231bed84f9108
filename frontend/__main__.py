"""`python -m nanoserve.frontend --model DIR --worker-address HOST:PORT --port P`: runs the frontend service
until SIGTERM or SIGINT, then drains (NOT_SERVING, in-flight calls finish within the grace period).
"""

import asyncio
import logging
import signal
import sys

from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.server import FrontendServer
from nanoserve.config import parse_config
from nanoserve.log import setup_logging

logger = logging.getLogger("frontend")


def resolve_model_dir(config: FrontendConfig) -> str:
    if config.model is not None:
        return config.model
    from nanoserve.tiny_model import default_model_dir  # builds the embedded model on first use

    return str(default_model_dir())


async def serve(config: FrontendConfig) -> None:
    model_dir = resolve_model_dir(config)
    server = FrontendServer(config, model_dir)
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


def main(argv: list[str] | None = None) -> None:
    config = parse_config(FrontendConfig, argv)
    setup_logging("frontend", config.log_level)
    try:
        asyncio.run(serve(config))
    except ValueError as e:  # unusable model directory and the like: no traceback
        logger.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()
