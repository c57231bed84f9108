"""How one request's output ids become text, one id at a time. The frontend's Detokenizer pushes
each new id into a TextStream and gets back the text it completes (only whole characters), then
matches stop strings in it. ByteText serves byte-level BPE tokenizers (Qwen's) from a table of each
id's bytes; WindowText serves any tokenizer through its decode.
"""

import codecs
from collections.abc import Callable, Sequence
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

REPLACEMENT_CHAR = "\ufffd"
# A UTF-8 character is at most 4 bytes and a byte-level token carries at least one, so a decode
# still ending in U+FFFD after this many tokens is a genuine U+FFFD, not a split character.
MAX_HELD_TOKENS = 6


class TextStream(Protocol):
    def push(self, token_id: int) -> str:
        """The text this id completes ("" while a character is still split)."""
        ...

    def flush(self) -> str:
        """What is still held once the output ended (a split character as U+FFFD)."""
        ...


class WindowText:
    """Any tokenizer: each id decodes a few-token window twice (the prefix and read offsets of TGI
    and vLLM), never the whole output, and releases the window's new text once it ends in a whole
    character. ~4 µs a token with the Qwen tokenizer."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the window decoded for context
        self._read_offset = 0  # ids before it have had their text released

    def push(self, token_id: int) -> str:
        ids = self._ids
        ids.append(token_id)
        prefix_text = self._decode(ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(ids[self._prefix_offset :])
        held = len(ids) - self._read_offset
        complete = len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR)
        if not (complete or held >= MAX_HELD_TOKENS):
            return ""  # mid-character: wait for the bytes that complete it
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


class ByteText:
    """A byte-level BPE tokenizer's decode is its ids' bytes joined and read as UTF-8 (invalid
    bytes as U+FFFD), so a stream is a table lookup and Python's incremental UTF-8 decoder, which
    holds a split character's bytes until they complete: ~0.5 µs a token."""

    __slots__ = ("_table", "_utf8")

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        table = self._table
        # an id past the tokenizer's (the model's padded vocabulary) decodes to nothing, as there
        return self._utf8.decode(table[token_id] if token_id < len(table) else b"")

    def flush(self) -> str:
        return self._utf8.decode(b"", True)


def _byte_of_char() -> dict[int, int]:
    """GPT-2's byte-level alphabet, reversed: each printable stand-in character -> its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = 256 + n  # the rest are shifted past Latin-1
    return {c: b for b, c in chars.items()}


def byte_tables(tokenizer: HFTokenizer) -> tuple[list[bytes], list[bytes]] | None:
    """Each id's bytes for a byte-level BPE tokenizer, (special tokens kept, special tokens
    skipped), or None for any other. Checked against the tokenizer's own decode of all its ids in
    one sequence (~0.15 s for Qwen's 151,669 at start-up): one that differs keeps WindowText."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    added = tokenizer.get_added_tokens_decoder()  # id -> AddedToken, decoded as their text
    stand_ins = {c: chr(b) for c, b in _byte_of_char().items()}
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    table = [b""] * n
    for i in range(n):
        token = tokenizer.id_to_token(i)
        if i in added:
            table[i] = added[i].content.encode()
        elif token is not None:
            try:  # a char outside the alphabet fails latin-1: not byte-level after all
                table[i] = token.translate(stand_ins).encode("latin-1")
            except UnicodeEncodeError:
                return None
    every_id = list(range(n))
    if b"".join(table).decode("utf-8", "replace") != tokenizer.decode(every_id, False):
        return None
    skipped = [b"" if i in added and added[i].special else b for i, b in enumerate(table)]
    if b"".join(skipped).decode("utf-8", "replace") != tokenizer.decode(every_id, True):
        return None  # the tokenizer skips other tokens than those it marks special
    return table, skipped
