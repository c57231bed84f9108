"""Request bodies -> protocol.py's models, for the gateway's routes (app.py). A body past
INLINE_BYTES is parsed and validated in a worker process: json parsing and pydantic hold the GIL,
so a thread would stall the event loop all the same (8 MB of 600k object keys took 0.3 s of it).
"""

import asyncio
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from nanoserve.process import die_with

M = TypeVar("M", bound=BaseModel)
# Parsed on the event loop: a few milliseconds even for the slowest JSON shapes (many object keys)
INLINE_BYTES = 256 * 1024


def validate(model: type[M], body: bytes) -> M | list[dict[str, Any]]:
    """The model, or pydantic's first error with FastAPI's location ("body", field, ...): plain
    data that crosses a process boundary (the 400 names one parameter; a list of 65,536 bad ids
    has as many errors)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        first = e.errors(include_url=False, include_context=False, include_input=False)[0]
        return [{**first, "loc": ("body", *first["loc"])}]


class BodyParser:
    """One pool of `processes` spawned workers for large bodies, shared by every route; the
    workers start with the first large body (or warm())."""

    def __init__(self, processes: int = 2) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def _workers(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawn: a forked child would inherit the event loop's threads
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.processes, context, initializer=die_with, initargs=(os.getpid(),)
            )
        return self._pool

    async def warm(self, model: type[BaseModel]) -> None:
        """Starts the workers and imports `model`'s module there, before the first large body."""
        await asyncio.get_running_loop().run_in_executor(self._workers(), validate, model, b"{}")

    async def parse(self, model: type[M], body: bytes) -> M:
        """The validated body; RequestValidationError (app.py's 400) when it is not valid."""
        if len(body) <= INLINE_BYTES:
            result = validate(model, body)
        else:
            loop = asyncio.get_running_loop()
            try:
                result = await loop.run_in_executor(self._workers(), validate, model, body)
            except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool, once
                self.close()
                result = await loop.run_in_executor(self._workers(), validate, model, body)
        if isinstance(result, list):
            raise RequestValidationError(result)
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
