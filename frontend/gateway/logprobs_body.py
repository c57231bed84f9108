"""The client's TokenLogprobs as OpenAI's logprobs bodies: chat's `{"content": [{token, logprob,
bytes, top_logprobs}]}`, the legacy completions shape (tokens, token_logprobs, top_logprobs dicts,
text_offset) and vLLM's prompt_logprobs list. responses.py puts them on choices.
"""

import math
from collections.abc import Sequence
from typing import Any

from nanoserve.client.messages import TokenLogprobs

# JSON has no -inf (a token the processed distribution filtered out): vLLM's stand-in for it.
FLOOR = -9999.0
# The logprob of the first prompt token's entry when completions echo the prompt (echo.py): it has
# none, and the legacy shape gives it a null logprob and null top_logprobs (OpenAI's, vLLM's).
NO_LOGPROB = math.nan


def _lp(value: float) -> float:
    return max(value, FLOOR)


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
    """choices[].logprobs of a chat reply or delta."""
    if entries is None:
        return None
    return {
        "content": [
            {
                **_token(e.text, e.logprob),
                "top_logprobs": [_token(t.text, t.logprob) for t in e.top_logprobs],
            }
            for e in entries
        ]
    }


def completion_logprobs(
    entries: Sequence[TokenLogprobs] | None, offset: int = 0
) -> dict[str, Any] | None:
    """choices[].logprobs of a text completion (or of one streamed delta: `offset` is where its
    first token starts in the choice's text). Each top_logprobs dict holds the alternatives and
    the sampled token, keyed by text; an entry with NO_LOGPROB has null for both."""
    if entries is None:
        return None
    text_offset = []
    for e in entries:
        text_offset.append(offset)
        offset += len(e.text)
    return {
        "tokens": [e.text for e in entries],
        "token_logprobs": [None if math.isnan(e.logprob) else _lp(e.logprob) for e in entries],
        "top_logprobs": [
            None
            if math.isnan(e.logprob)
            else {**{t.text: _lp(t.logprob) for t in e.top_logprobs}, e.text: _lp(e.logprob)}
            for e in entries
        ],
        "text_offset": text_offset,
    }


def prompt_logprobs(entries: Sequence[TokenLogprobs] | None, first: bool) -> list | None:
    """vLLM's prompt_logprobs: per prompt position {token id: {logprob, rank, decoded_token}},
    the prompt token first, then its alternatives; `first` adds position 0's null."""
    if entries is None:
        return None
    body: list[dict[str, Any] | None] = [None] if first else []
    for e in entries:
        position = {
            str(t.token_id): {"logprob": _lp(t.logprob), "rank": rank, "decoded_token": t.text}
            for rank, t in enumerate(e.top_logprobs, 1)
        }
        position[str(e.token_id)] = {
            "logprob": _lp(e.logprob),
            "rank": e.rank,
            "decoded_token": e.text,
        }
        body.append(position)
    return body
