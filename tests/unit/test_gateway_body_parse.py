"""The gateway's body parsing (frontend.gateway.body_parse): small bodies on the event loop, large
ones in a worker process, the same model or the same 400 errors either way; a killed worker is
replaced."""

import asyncio
import json
import os
import signal

import pytest
from fastapi.exceptions import RequestValidationError

from nanoserve.frontend.gateway.body_parse import INLINE_BYTES, BodyParser
from nanoserve.frontend.gateway.protocol import CompletionRequest


def body(prompt_ids: int, **fields) -> bytes:
    return json.dumps({"model": "m", "prompt": [7] * prompt_ids, **fields}).encode()


SMALL, LARGE = body(10), body(INLINE_BYTES // 2)  # 3 bytes an id: past INLINE_BYTES


def test_small_and_large_bodies_give_the_same_model_and_errors() -> None:
    async def main() -> None:
        parser = BodyParser(processes=1)
        try:
            small = await parser.parse(CompletionRequest, SMALL)
            assert parser._pool is None  # parsed inline: no worker started
            large = await parser.parse(CompletionRequest, LARGE)
            assert parser._pool is not None and len(LARGE) > INLINE_BYTES
            assert small.prompt == [7] * 10 and large.prompt == [7] * (INLINE_BYTES // 2)
            for raw in (body(10, logit_bias={"1": "much"}), body(INLINE_BYTES // 2, n="x")):
                with pytest.raises(RequestValidationError) as raised:
                    await parser.parse(CompletionRequest, raw)
                (error,) = raised.value.errors()
                assert error["loc"][0] == "body" and error["loc"][1] in ("logit_bias", "n")
            with pytest.raises(RequestValidationError) as raised:
                await parser.parse(CompletionRequest, b"{" * (INLINE_BYTES + 1))
            assert raised.value.errors()[0]["type"] == "json_invalid"
        finally:
            parser.close()

    asyncio.run(main())


def test_a_killed_worker_is_replaced() -> None:
    async def main() -> None:
        parser = BodyParser(processes=1)
        try:
            await parser.warm(CompletionRequest)
            assert parser._pool is not None
            for pid in list(parser._pool._processes):  # type: ignore[attr-defined]
                os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.2)
            parsed = await parser.parse(CompletionRequest, LARGE)
            assert len(parsed.prompt) == INLINE_BYTES // 2
        finally:
            parser.close()

    asyncio.run(main())
