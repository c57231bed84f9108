"""Stop strings over one request's streamed text: the frontend pushes each GenerateTokensResponse's
ids through the request's TextStream (text.text_stream: whole characters only) and streams the
deltas this releases, holding back what may still be the start of a stop string.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from nanoserve.text.text_stream import TextStream


@dataclass(slots=True)
class DetokenizerOutput:
    """What one add() call releases."""

    text: str  # delta to stream; valid UTF-8, never part of a possible stop string
    num_tokens: int  # ids consumed from the batch: all of them, or up to the one completing a stop
    matched_stop: str | None = None  # set when a stop string matched; the request is finished


class Detokenizer:
    """Turns a stream of token ids into text deltas, holding back a possible partial stop string.

    `text` turns ids into text (Tokenizer.text_stream, skip_special_tokens bound). Stop strings are
    searched in the whole output text, including across token boundaries; on a match the text is
    cut before the stop string (or after it with include_stop_str_in_output) and the rest dropped.
    """

    def __init__(
        self,
        text: TextStream,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._text = text
        self._stop = tuple(stop)
        self._include_stop = include_stop_str_in_output
        self._min_tokens = min_tokens  # no stop string ends the output before this many ids (vLLM)
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        # For each stop string and last character c: the lengths k (longest first) whose prefix
        # stop[:k] is proper and ends with c, the only candidates for a partial match ending in c.
        self._prefix_ends: list[tuple[str, dict[str, list[int]]]] = []
        for stop_string in self._stop:
            ends: dict[str, list[int]] = {}
            for k in range(len(stop_string) - 1, 0, -1):
                ends.setdefault(stop_string[k - 1], []).append(k)
            self._prefix_ends.append((stop_string, ends))
        self.num_tokens = 0  # ids pushed into `text`
        # The output text's tail: only the last max_stop_len - 1 characters can start a stop match,
        # so older text is dropped and the cost per token stays bounded.
        self._tail = ""
        self._tail_start = 0  # offset of _tail[0] in the whole output text
        self._text_len = 0  # characters of output text decoded so far
        self._emitted = 0  # characters of output text released to the caller
        self.finished = False

    def add(self, token_ids: Sequence[int], skip_last: bool = False) -> DetokenizerOutput:
        """Consumes new ids. `skip_last` keeps the last id's text out of the output (a stop token
        id that ended the request, when include_stop_str_in_output is false)."""
        if self.finished:
            raise RuntimeError("add() after the detokenizer finished")
        pieces: list[str] = []
        push = self._text.push
        for i, token_id in enumerate(token_ids):
            if skip_last and i == len(token_ids) - 1:
                break  # counted as consumed, never decoded
            self.num_tokens += 1
            matched = self._push_text(push(token_id), pieces)
            if matched is not None:
                return DetokenizerOutput("".join(pieces), i + 1, matched)
        return DetokenizerOutput("".join(pieces), len(token_ids))

    def flush(self) -> DetokenizerOutput:
        """Releases everything held back: called once the request finished without a stop string
        (eos, stop token, length). Text of ids still mid-character is released as it decodes."""
        pieces: list[str] = []
        matched = None
        if not self.finished:
            matched = self._push_text(self._text.flush(), pieces)
        if not self.finished:
            pieces.append(self._tail[self._emitted - self._tail_start :])
            self._emitted = self._text_len
            self.finished = True
        return DetokenizerOutput("".join(pieces), 0, matched)

    def _push_text(self, delta: str, pieces: list[str]) -> str | None:
        """Appends decoded text, releases what can no longer be part of a stop string into
        `pieces`, and returns the matched stop string, if any."""
        if not delta:
            return None
        old_len = self._text_len
        self._tail += delta
        self._text_len += len(delta)
        if not self._stop:
            pieces.append(delta)
            self._emitted = self._text_len
            self._tail, self._tail_start = "", self._text_len
            return None
        match = self._find_stop(old_len) if self.num_tokens >= self._min_tokens else None
        if match is not None:
            start, stop = match
            end = start + len(stop) if self._include_stop else start
            pieces.append(self._tail[self._emitted - self._tail_start : end - self._tail_start])
            self._emitted = end
            self.finished = True
            return stop
        release = self._text_len - self._partial_match_len()
        if release > self._emitted:
            pieces.append(self._tail[self._emitted - self._tail_start : release - self._tail_start])
            self._emitted = release
        keep_from = min(self._emitted, self._text_len - self._max_stop_len + 1)
        if keep_from > self._tail_start:
            self._tail = self._tail[keep_from - self._tail_start :]
            self._tail_start = keep_from
        return None

    def _find_stop(self, old_len: int) -> tuple[int, str] | None:
        """The earliest stop string that ends in the new text: (its offset, the string)."""
        best: tuple[int, str] | None = None
        for stop in self._stop:
            search_from = max(old_len - len(stop) + 1, self._tail_start)
            index = self._tail.find(stop, search_from - self._tail_start)
            if index >= 0 and (best is None or index + self._tail_start < best[0]):
                best = (index + self._tail_start, stop)
        return best

    def _partial_match_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        if not self._tail:
            return 0
        for stop, ends in self._prefix_ends:
            for k in ends.get(self._tail[-1], ()):
                if k <= longest:
                    break
                if k <= len(self._tail) and self._tail.endswith(stop[:k]):
                    longest = k
                    break
        return longest


class IdsOnly:
    """A Detokenizer for a request with SamplingParams.detokenize false: every id is consumed,
    no text is made, no stop string is matched."""

    def add(self, token_ids: Sequence[int], skip_last: bool = False) -> DetokenizerOutput:
        return DetokenizerOutput("", len(token_ids))

    def flush(self) -> DetokenizerOutput:
        return DetokenizerOutput("", 0)
