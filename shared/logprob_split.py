"""Bounding the logprob entries of one response message: a completion's new ids with their
logprobs and the prompt's logprobs -> pieces of at most `max_entries` entries, in order (the
worker's GenerateTokens/Session outputs and the frontend's Generate/Chat messages).
"""

from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

# Worker messages (TokenLogprobs without texts, 20 alternatives): an alternative is ~11 bytes
# (token id 1+3, logprob 1+4, submessage header 2), an entry 20 * 11 + ~16 ≈ 240 bytes, so
# 1,024 entries ≈ 0.25 MB. The frontend adds texts (FrontendConfig.max_logprobs_per_message).
MAX_LOGPROBS_PER_MESSAGE = 1024

Entry = TypeVar("Entry")


class Piece(NamedTuple, Generic[Entry]):
    """One message's share: ids and their logprobs (one entry per id when asked, else none),
    and prompt entries. `last` marks the final piece (the one that carries a finish). A tuple:
    one is made per streamed message, and a frozen dataclass costs ~4x as much to build."""

    ids: list[int]
    logprobs: list[Entry]
    prompt_logprobs: list[Entry]
    last: bool


def split_logprobs(
    ids: list[int],
    logprobs: Sequence[Entry],
    prompt_logprobs: Sequence[Entry],
    max_entries: int,
) -> list[Piece[Entry]]:
    """Pieces of at most `max_entries` entries (prompt and output together), prompt entries
    first; ids travel with their logprobs (with none asked, all ids go in the final piece).
    Always at least one piece; one when everything fits."""
    assert max_entries >= 1
    pieces: list[Piece[Entry]] = []
    p = i = 0
    while True:
        room = max_entries
        prompt = list(prompt_logprobs[p : p + room])
        p += len(prompt)
        room -= len(prompt)
        take = 0 if p < len(prompt_logprobs) else room if logprobs else len(ids) - i
        chunk = ids[i : i + take]
        chunk_logprobs = list(logprobs[i : i + len(chunk)])
        i += len(chunk)
        last = p == len(prompt_logprobs) and i == len(ids)
        pieces.append(Piece(chunk, chunk_logprobs, prompt, last))
        if last:
            return pieces
