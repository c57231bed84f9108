"""The serving benchmark's HTTP paths: one OpenAI /v1/completions or /v1/chat/completions request
streamed from the gateway over a plain asyncio connection (the GPU machine has no HTTP client
library), its server-sent events turned into messages shaped like the gRPC responses loadgen times
(`token_ids`: one per event with output; the usage event adds the tokens that came without).
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nanoserve.benchmarks.workload import Request


class GatewayError(Exception):
    """A refused request (HTTP status other than 200) or an error event mid-stream."""


@dataclass(frozen=True, slots=True)
class Message:
    token_ids: list[int]


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives: chunked (uvicorn's streams) or to the end."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        yield await reader.read()
        return
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readline()  # the CRLF after each chunk


async def _request(
    address: str, method: str, path: str, payload: dict | None
) -> tuple[int, AsyncIterator[bytes], asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(payload).encode() if payload is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, _body(reader, headers), writer


async def get_json(address: str, path: str) -> dict:
    status, body, writer = await _request(address, "GET", path, None)
    try:
        text = b"".join([part async for part in body])
    finally:
        writer.close()
    if status != 200:
        raise GatewayError(f"HTTP {status}: {text[:300]!r}")
    return json.loads(text)


# Chat takes text, not ids: a prompt's ids become words that Qwen's BPE keeps one token each (a
# leading space and a common English word), so a chat prompt has as many tokens as its ids (with
# Qwen's tokenizer) plus the template's. Random choices of them share no prefix beyond the template's.
_COMMON_WORDS = (
    " the of and to in is that for it as with was on be at by this had not are but from or have an"
    " they which one you were her all she there would their we him been has when who will more no"
    " if out so said what up its about into than them can only other new some could time these"
    " two may then do first any my now such like our over man me even most made after also did"
    " many before must through back years where much your way well down should because each just"
    " those people how too little state good very make world still own see men work long get here"
    " between both life being under never day same another know while last might us great old"
    " year off come since against go came right used take three"
)
WORDS = _COMMON_WORDS.split()


def chat_text(ids: list[int]) -> str:
    return "".join(" " + WORDS[i % len(WORDS)] for i in ids).lstrip()


def _has_output(chunk: dict, chat: bool) -> bool:
    """Whether a streamed chunk carries a token's output: completion text, or a chat delta's
    content, reasoning or tool call."""
    if not chunk["choices"]:
        return False
    choice = chunk["choices"][0]
    if not chat:
        return bool(choice["text"])
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


async def stream_completion(
    address: str, payload: dict, chat: bool = False
) -> AsyncIterator[Message]:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, body, writer = await _request(address, "POST", path, payload)
    try:
        if status != 200:
            text = b"".join([part async for part in body])
            raise GatewayError(f"HTTP {status}: {text[:300]!r}")
        buffer, seen = b"", 0
        async for part in body:
            buffer += part
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                if event == b"data: [DONE]":
                    return
                chunk = json.loads(event[6:])
                if "error" in chunk:
                    raise GatewayError(chunk["error"].get("message", "error event"))
                if chunk.get("usage"):
                    rest = chunk["usage"]["completion_tokens"] - seen
                    if rest > 0:
                        seen += rest
                        yield Message([0] * rest)
                elif _has_output(chunk, chat):
                    seen += 1
                    yield Message([0])
    finally:
        writer.close()


async def starter(
    address: str, temperature: float, chat: bool = False
) -> Callable[[Request], AsyncIterator[Message]]:
    """loadgen's `start` for the gateway: Request -> streamed completion of its prompt ids, or
    (chat) of one user message of as many words."""
    model = (await get_json(address, "/v1/models"))["data"][0]["id"]

    def start(r: Request) -> AsyncIterator[Message]:
        payload: dict = {
            "model": model,
            "max_tokens": r.max_tokens,
            "temperature": temperature,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            payload["messages"] = [{"role": "user", "content": chat_text(r.prompt_token_ids)}]
        else:
            payload["prompt"] = r.prompt_token_ids
        return stream_completion(address, payload, chat)

    return start
