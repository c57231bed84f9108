"""`python -m tests.e2e.stream_holder grpc ADDRESS N` or `... http BASE_URL MODEL N`: a client
process that opens N long streams (gRPC Generate, or streamed /v1/completions), prints `open` once
each has sent its first output, then holds them until it is killed (tests/e2e/test_hang_ups.py)."""

import asyncio
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from nanoserve.client import AsyncClient

LONG = {"max_tokens": 3000, "ignore_eos": True}


async def hold_grpc(address: str, n: int) -> None:
    client = AsyncClient(address, timeout=600)
    streams = [client.generate_stream("Tell me a story", **LONG) for _ in range(n)]
    await asyncio.gather(*(anext(s) for s in streams))
    print("open", flush=True)
    await asyncio.Event().wait()  # until killed


def hold_http(base_url: str, model: str, n: int) -> None:
    body = json.dumps({"model": model, "prompt": "Hi", "stream": True, **LONG}).encode()

    def first_event() -> object:
        request = urllib.request.Request(
            base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        response = urllib.request.urlopen(request, timeout=600)
        assert response.readline().startswith(b"data: ")
        return response  # kept open

    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(lambda _: first_event(), range(n)))
    print("open", flush=True)
    sys.stdin.read()  # until killed
    del responses


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    if kind == "grpc":
        asyncio.run(hold_grpc(args[0], int(args[1])))
    else:
        hold_http(args[0], args[1], int(args[2]))
