"""vLLM's /tokenize and /detokenize routes on the gateway: the request bodies and their answers,
made with FrontendService's Tokenize, Detokenize and GetModelInfo under the caller's token."""

from typing import Annotated

from pydantic import Field

from nanoserve.client import AsyncClient
from nanoserve.errors import ServiceError
from nanoserve.frontend.gateway.errors import from_service_error
from nanoserve.frontend.gateway.protocol import MAX_LIST, Name, Text, UInt32, _Strict


class TokenizeBody(_Strict):
    model: Name | None = None
    prompt: Text
    add_special_tokens: bool | None = None


class DetokenizeBody(_Strict):
    model: Name | None = None
    tokens: Annotated[list[UInt32], Field(max_length=MAX_LIST)]


async def tokenize(client: AsyncClient, body: TokenizeBody) -> dict:
    """{"tokens": [...], "count": n, "max_model_len": L}, as vLLM answers."""
    try:
        tokens = await client.tokenize(body.prompt, body.add_special_tokens)
        info = await client.model_info()
    except ServiceError as e:
        raise from_service_error(e, {"text": "prompt"}) from None
    return {"tokens": tokens, "count": len(tokens), "max_model_len": info.max_model_len}


async def detokenize(client: AsyncClient, body: DetokenizeBody) -> dict:
    """{"prompt": text}, as vLLM answers (special tokens skipped, its default)."""
    try:
        decoded = await client.detokenize(body.tokens)
    except ServiceError as e:
        raise from_service_error(e, {"token_ids": "tokens"}) from None
    return {"prompt": decoded.text}
