"""nanoserve.frontend.text.detokenizer with the real Qwen byte-level BPE: split characters, stop strings."""

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from nanoserve.frontend.text.detokenizer import Detokenizer
from nanoserve.text.text_stream import (
    MAX_HELD_TOKENS,
    ByteText,
    TextStream,
    WindowText,
    byte_tables,
)

IM_END = "<|im_end|>"
TEXTS = [
    "你好，世界！今天天气很好。",
    "emoji 😀🎉 and family 👨‍👩‍👧 ok",
    "mixed: Grüße, naïve café, 日本語テキスト, 한국어, Ελληνικά, עברית",
    "code:\n\tdef f(x):\n\t\treturn x ** 2  # ∑∫√",
    "rare CJK 𠀀𪚥 and flags 🇯🇵🇫🇷",
]


@pytest.fixture(scope="module")
def tok(tokenizer_files_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_files_dir / "tokenizer.json"))


Streams = Callable[..., TextStream]  # (skip_special_tokens=True) -> a new TextStream


@pytest.fixture(scope="module", params=["window", "bytes"])
def stream(request: pytest.FixtureRequest, tok: Tokenizer) -> Streams:
    """Every test runs on both text streams: the windowed decodes and the byte table."""
    if request.param == "window":
        return lambda skip_special_tokens=True: WindowText(
            lambda ids: tok.decode(ids, skip_special_tokens=skip_special_tokens)
        )
    tables = byte_tables(tok)
    assert tables is not None  # Qwen's tokenizer is byte-level BPE
    return lambda skip_special_tokens=True: ByteText(tables[1 if skip_special_tokens else 0])


def _run(detok: Detokenizer, batches: list[list[int]]) -> tuple[list[str], str | None]:
    deltas, matched = [], None
    for batch in batches:
        out = detok.add(batch)
        deltas.append(out.text)
        if out.matched_stop is not None:
            return deltas, out.matched_stop
    deltas.append(detok.flush().text)
    return deltas, matched


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_never_splits_a_character(
    tok: Tokenizer, stream: Streams, text: str
) -> None:
    ids = tok.encode(text).ids
    # The fixture really exercises split characters: some single tokens decode to U+FFFD.
    if any(ord(c) > 0xFFFF or "\u4e00" <= c <= "\u9fff" for c in text):
        assert any("\ufffd" in tok.decode([i]) for i in ids) or len(ids) < len(text)
    deltas, _ = _run(Detokenizer(stream()), [[i] for i in ids])
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_emoji_bytes_held_until_complete(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode(" 👨").ids  # one emoji spread over several byte tokens
    assert len(ids) > 1 and "\ufffd" in tok.decode(ids[:1])
    detok = Detokenizer(stream())
    # the byte table releases the leading space at once, the windows with the emoji: either way
    # the emoji comes out whole with its last byte, never as U+FFFD
    held = [detok.add([i]).text for i in ids[:-1]]
    assert "".join(held) in ("", " ")
    assert "".join(held) + detok.add(ids[-1:]).text == " 👨"


def test_decode_window_stays_small(tok: Tokenizer) -> None:
    """No re-decoding of the whole output: every decode sees a few tokens only."""
    sizes: list[int] = []

    def decode(ids: list[int]) -> str:
        sizes.append(len(ids))
        return tok.decode(ids)

    ids = tok.encode(" ".join(TEXTS) * 20).ids
    deltas, _ = _run(Detokenizer(WindowText(decode)), [[i] for i in ids])
    assert "".join(deltas) == tok.decode(ids)
    assert len(ids) > 500 and max(sizes) <= 2 * MAX_HELD_TOKENS


def test_special_tokens_skipped_or_kept(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("hi" + IM_END).ids
    assert _run(Detokenizer(stream()), [[i] for i in ids])[0][-2:] != [IM_END]
    assert "".join(_run(Detokenizer(stream()), [ids])[0]) == "hi"
    kept = _run(Detokenizer(stream(skip_special_tokens=False)), [[i] for i in ids])[0]
    assert "".join(kept) == "hi" + IM_END


def test_genuine_replacement_char_is_not_held_forever(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("a\ufffdb").ids
    deltas, _ = _run(Detokenizer(stream()), [[i] for i in ids])
    assert "".join(deltas) == "a\ufffdb"
    # Invalid bytes that never complete: released after MAX_HELD_TOKENS, not only at the end.
    lone = tok.encode(" 👨").ids[-1:]  # a lone UTF-8 continuation byte
    detok = Detokenizer(stream())
    released = "".join(detok.add(lone).text for _ in range(MAX_HELD_TOKENS + 1))
    assert "\ufffd" in released


@given(
    data=st.data(),
    text=st.text(
        alphabet=st.characters(
            min_codepoint=0x20, max_codepoint=0x2FFFF, categories=["L", "N", "P", "S", "Zs"]
        ),
        min_size=1,
        max_size=40,
    ),
)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_random_splits_concatenate_to_full_decode(
    tok: Tokenizer, stream: Streams, data, text: str
) -> None:
    text = data.draw(st.sampled_from(TEXTS + [text]))
    ids = tok.encode(text).ids
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids))))
    batches = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True) if b > a]
    deltas, _ = _run(Detokenizer(stream()), batches)
    assert "".join(deltas) == tok.decode(ids)
    assert "\ufffd" not in "".join(deltas)


def test_stop_string_spanning_tokens(tok: Tokenizer, stream: Streams) -> None:
    text = "The answer is 42.\n\nObservation: done"
    ids = tok.encode(text).ids
    detok = Detokenizer(stream(), stop=["\n\nObs"])
    deltas, matched = _run(detok, [[i] for i in ids])
    assert matched == "\n\nObs"
    assert "".join(deltas) == "The answer is 42."
    # the stop's first characters were never streamed early
    assert not any("\n" in d for d in deltas)


def test_stop_string_inside_one_token_and_include_option(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("hello world again").ids
    deltas, matched = _run(Detokenizer(stream(), stop=["orl"]), [[i] for i in ids])
    assert (matched, "".join(deltas)) == ("orl", "hello w")
    detok = Detokenizer(stream(), stop=["orl"], include_stop_str_in_output=True)
    deltas, matched = _run(detok, [[i] for i in ids])
    assert (matched, "".join(deltas)) == ("orl", "hello worl")


def test_stop_string_num_tokens_counts_up_to_the_match(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("one two three four").ids
    out = Detokenizer(stream(), stop=[" three"]).add(ids)
    assert out.matched_stop == " three" and out.text == "one two"
    assert out.num_tokens == len(tok.encode("one two three").ids)


def test_partial_match_held_then_released(tok: Tokenizer, stream: Streams) -> None:
    detok = Detokenizer(stream(), stop=["STOP!"])
    ids = tok.encode("go STOP no").ids
    deltas = [detok.add([i]).text for i in ids]
    assert "".join(deltas) + detok.flush().text == "go STOP no"
    held = Detokenizer(stream(), stop=["world"])
    assert held.add(tok.encode("hello wor").ids).text == "hello "  # "wor" might start "world"
    assert held.flush().text == "wor"


def test_earliest_of_several_stops_wins_and_multibyte_stop(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("abc 世界 xyz def").ids
    deltas, matched = _run(Detokenizer(stream(), stop=["def", "界", "xyz"]), [[i] for i in ids])
    assert (matched, "".join(deltas)) == ("界", "abc 世")


@given(text=st.sampled_from(TEXTS), data=st.data())
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_streamed_stop_equals_non_streamed(
    tok: Tokenizer, stream: Streams, text: str, data
) -> None:
    """Whatever the batching, the output equals the full text cut at the first stop occurrence."""
    ids = tok.encode(text).ids
    start = data.draw(st.integers(0, len(text) - 2))
    stop = text[start : start + data.draw(st.integers(1, 3))]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids))))
    batches = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True) if b > a]
    deltas, matched = _run(Detokenizer(stream(), stop=[stop]), batches)
    assert matched == stop
    assert "".join(deltas) == text[: text.index(stop)]


def test_skip_last_and_errors(tok: Tokenizer, stream: Streams) -> None:
    ids = tok.encode("done.").ids
    detok = Detokenizer(stream())
    out = detok.add(ids, skip_last=True)  # a stop token id's text stays out
    assert out.num_tokens == len(ids)
    assert out.text + detok.flush().text == tok.decode(ids[:-1])
    with pytest.raises(RuntimeError):
        detok.add([1])
    with pytest.raises(ValueError):
        Detokenizer(stream(), stop=[""])


def test_stop_string_does_not_end_the_output_before_min_tokens(
    tok: Tokenizer, stream: Streams
) -> None:
    """vLLM: stop strings are not checked until min_tokens ids are out (before: a stop string in
    the first token ended a min_tokens=30 request after one token)."""
    ids = tok.encode("one two one two one two").ids
    detok = Detokenizer(stream(), stop=["one"], min_tokens=3)
    deltas, matched = _run(detok, [[i] for i in ids])
    assert matched == "one" and "".join(deltas) == "one two "  # the third id is the 2nd "one"
    deltas, matched = _run(
        Detokenizer(stream(), stop=["one"], min_tokens=len(ids) + 1), [[i] for i in ids]
    )
    assert matched is None and "".join(deltas) == "one two one two one two"
