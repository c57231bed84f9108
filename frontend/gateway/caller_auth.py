"""The gateway's door: a caller's bearer token is checked before its body is read (issue 32), so a
caller without a valid key costs one cheap refused call, never a body parse, and learns nothing of
the served model. The frontend owns the keys: the gateway asks it once per token (GetModelInfo with
that token; the frontend refuses it before reading anything) and keeps the answer for AUTH_TTL_S.
"""

import asyncio
import collections
import time
from collections.abc import Callable

import grpc
from fastapi import Request

from nanoserve.client import AsyncClient
from nanoserve.errors import ServiceError
from nanoserve.frontend.gateway.errors import OpenAIError, from_service_error

_BEARER = "bearer "
MAX_TOKEN_CHARS = 4096  # a longer header is no key of ours
AUTH_TTL_S = 10.0  # a revoked key keeps working here at most this long
MAX_CACHED = 4096  # tokens remembered (least recently used go first): bounded memory
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def _unauthenticated(why: str) -> OpenAIError:
    return OpenAIError(401, why, "authentication_error", code="invalid_api_key")


def caller_token(request: Request) -> str | None:
    """The caller's `Authorization: Bearer` token; 401 for one no key can be: not printable ASCII
    (gRPC metadata refuses those) or longer than MAX_TOKEN_CHARS."""
    value = request.headers.get("authorization", "")
    if value[: len(_BEARER)].lower() != _BEARER:
        return None
    token = value[len(_BEARER) :].strip()
    if len(token) > MAX_TOKEN_CHARS or not all("!" <= c <= "~" for c in token):
        raise _unauthenticated("malformed bearer token")
    return token or None


class CallerAuth:
    """`client_for(request)`: the frontend client carrying the caller's token, once the frontend
    took that token (cached), else an OpenAIError (401) raised before anything else is done."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        # token -> (expiry, None when accepted, else a maker of the refusal)
        self.cache: collections.OrderedDict[
            str | None, tuple[float, Callable[[], OpenAIError] | None]
        ] = collections.OrderedDict()
        self.checking: dict[str | None, asyncio.Future] = {}  # token -> its check in flight

    async def client_for(self, request: Request) -> AsyncClient:
        token = caller_token(request)
        client = self.client.with_token(token)
        entry = self.cache.get(token)
        if entry is None or entry[0] < time.monotonic():
            pending = self.checking.get(token)
            if pending is None:  # one check in flight per token: a burst waits for it
                pending = self.checking[token] = asyncio.ensure_future(self._check(client, token))
                pending.add_done_callback(lambda _: self.checking.pop(token, None))
            entry = await asyncio.shield(pending)
        self.cache.move_to_end(token)
        assert entry is not None  # cached, or the check just made it
        refusal = entry[1]
        if refusal is not None:
            raise refusal()
        return client

    async def _check(
        self, client: AsyncClient, token: str | None
    ) -> tuple[float, Callable[[], OpenAIError] | None]:
        refusal = None
        try:
            await client.model_info()
        except ServiceError as e:
            if e.code not in _REFUSED:
                raise from_service_error(e) from None  # the frontend is down: not cached
            error = from_service_error(e)
            refusal = lambda: OpenAIError(
                error.status, error.message, error.type, error.param, error.code
            )
        entry = self.cache[token] = (time.monotonic() + AUTH_TTL_S, refusal)
        while len(self.cache) > MAX_CACHED:
            self.cache.popitem(last=False)
        return entry
