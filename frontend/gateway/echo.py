"""echo: true on /v1/completions, between the gRPC call's chunks and the reply (app.py wraps the
call's chunks): each choice's first chunk gets the prompt's text and, with logprobs, the prompt
tokens' entries ahead of its own; with max_tokens 0 the one token the call generated is dropped.
"""

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from nanoserve.client import AsyncClient
from nanoserve.client.messages import Chunk, Detokenized, TokenLogprobs
from nanoserve.frontend.gateway.completion_params import Echo
from nanoserve.frontend.gateway.logprobs_body import NO_LOGPROB


def _top(entry: TokenLogprobs, k: int) -> TokenLogprobs:
    """The entry with at most k alternatives (the call asked for the larger of two ks)."""
    if len(entry.top_logprobs) <= k:
        return entry
    return replace(entry, top_logprobs=entry.top_logprobs[:k])


async def decoded_prompt(client: AsyncClient, token_ids: list[int]) -> Detokenized:
    """A token-id prompt's text, whole and per id (the frontend's Detokenize: position 0 of a
    prompt has no logprob entry to carry its text)."""
    return await client.detokenize(token_ids, skip_special_tokens=False)


def prompt_echo(
    echo: Echo, rest: Sequence[TokenLogprobs], decoded: Detokenized | None
) -> tuple[str, list[TokenLogprobs] | None]:
    """(the echoed prompt text, the prompt's logprob entries or None without logprobs) from the
    entries of prompt positions 1.. (`rest`) and, for a token-id prompt, its decoded text.

    A text prompt is echoed as given, a token-id prompt as decoded (as vLLM does); the first
    token's text is what the others' leave of it, so text_offset (which counts token texts, as
    vLLM's does) points into the echoed text, unless a token splits a UTF-8 character (its text
    then holds U+FFFD)."""
    joined = "".join(e.text for e in rest)
    if isinstance(echo.prompt, str):
        text = echo.prompt
        first = text[: max(len(text) - len(joined), 0)]
        first_id = -1  # a text prompt's token ids are not returned
    else:
        assert decoded is not None
        text, first = decoded.text, decoded.token_texts[0]
        first_id = echo.prompt[0]
    if echo.logprobs is None:
        return text, None
    head = TokenLogprobs(first_id, NO_LOGPROB, 0, first, [])
    return text, [head, *(_top(e, echo.logprobs) for e in rest)]


def _client_view(echo: Echo, chunk: Chunk) -> Chunk:
    """The chunk as the client asked for it: prompt entries only if it asked (with its k), and
    with max_tokens 0 no token (finish "length", usage without it)."""
    p = echo.prompt_logprobs
    prompt = None
    if p is not None and chunk.prompt_logprobs:
        prompt = [_top(e, p) for e in chunk.prompt_logprobs]
    if not echo.no_tokens:
        return replace(chunk, prompt_logprobs=prompt)
    return replace(
        chunk,
        text="",
        token_ids=[],
        logprobs=None,
        prompt_logprobs=prompt,
        finish_reason=None if chunk.finish_reason is None else "length",
        matched_stop=None,
        matched_stop_token_id=None,
        # the dropped token is not counted (vLLM counts it: it reports the token it computed)
        usage=None if chunk.usage is None else replace(chunk.usage, completion_tokens=0),
    )


def _empty(chunk: Chunk) -> bool:
    return not (
        chunk.text
        or chunk.token_ids
        or chunk.logprobs
        or chunk.prompt_logprobs
        or chunk.finish_reason is not None
        or chunk.usage is not None
    )


async def echo_chunks(
    echo: Echo, chunks: AsyncIterator[Chunk], client: AsyncClient
) -> AsyncIterator[Chunk]:
    """The call's chunks with the prompt echoed. Prompt entries arrive with or before the first
    token (FrontendService's order), so they are all in by a choice's first token or finish."""
    decoding: asyncio.Future[Detokenized] | None = None
    if isinstance(echo.prompt, list):  # asked alongside the call: its text is needed at once
        decoding = asyncio.ensure_future(decoded_prompt(client, echo.prompt))
    rest: list[TokenLogprobs] = []
    prefix: tuple[str, list[TokenLogprobs] | None] | None = None
    echoed: set[int] = set()
    try:
        async for chunk in chunks:
            rest += chunk.prompt_logprobs or ()
            out = _client_view(echo, chunk)
            if chunk.index not in echoed and (chunk.token_ids or chunk.finish_reason is not None):
                echoed.add(chunk.index)
                if prefix is None:
                    prefix = prompt_echo(echo, rest, None if decoding is None else await decoding)
                text, entries = prefix
                logprobs = out.logprobs
                if entries is not None:
                    logprobs = entries + (out.logprobs or [])
                out = replace(out, text=text + out.text, logprobs=logprobs)
            if not _empty(out):
                yield out
    finally:
        if decoding is not None:
            decoding.cancel()
            if decoding.done() and not decoding.cancelled():
                decoding.exception()  # the call's own error (if any) is the one raised
        await chunks.aclose()  # type: ignore[attr-defined]
