"""nanoserve.text.text_stream: the byte table of a byte-level BPE tokenizer decodes exactly as the
tokenizer does, any ids in any order (split characters, invalid bytes, special tokens, ids past the
vocabulary); any other tokenizer keeps the windowed decodes."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from nanoserve.text.text_stream import ByteText, WindowText, byte_tables
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.tiny.tokenizer import ADDED_TOKENS, ENDOFTEXT_ID

NUM_IDS = ENDOFTEXT_ID + len(ADDED_TOKENS)  # Qwen3's 151,669
PADDED_VOCAB = 151936  # the model's vocabulary: ids past the tokenizer's decode to nothing


@pytest.fixture(scope="module")
def hf(tokenizer_files_dir: Path) -> HFTokenizer:
    return HFTokenizer.from_file(str(tokenizer_files_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def tables(hf: HFTokenizer) -> tuple[list[bytes], list[bytes]]:
    found = byte_tables(hf)
    assert found is not None
    return found


def test_qwen_tables_cover_every_id(hf: HFTokenizer, tables) -> None:
    kept, skipped = tables
    assert len(kept) == len(skipped) == NUM_IDS == hf.get_vocab_size(with_added_tokens=True)
    assert kept[ENDOFTEXT_ID] == b"<|endoftext|>" and skipped[ENDOFTEXT_ID] == b""
    think = hf.token_to_id("<think>")  # a plain added token: kept when skipping special ones
    assert kept[think] == skipped[think] == b"<think>"
    assert kept[hf.token_to_id("Ġhello")] == b" hello"  # Ġ stands in for the space byte


# ids that make split and invalid UTF-8 likely: byte tokens (the first 256 ids), special and
# added tokens, ids past the tokenizer, and any id
IDS = st.one_of(
    st.integers(0, 255),
    st.integers(ENDOFTEXT_ID, NUM_IDS - 1),
    st.integers(NUM_IDS, PADDED_VOCAB - 1),
    st.integers(0, NUM_IDS - 1),
)


@given(ids=st.lists(IDS, max_size=24), skip=st.booleans())
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_byte_text_streams_what_the_tokenizer_decodes(hf: HFTokenizer, tables, ids, skip) -> None:
    stream = ByteText(tables[1 if skip else 0])
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) + stream.flush() == hf.decode(ids, skip_special_tokens=skip)


def test_byte_text_holds_a_split_character_and_flushes_it_as_replacement(tables) -> None:
    kept, _ = tables
    emoji = "😀".encode()
    first, second = kept.index(emoji[:1]), kept.index(emoji[1:2])  # single-byte tokens
    stream = ByteText(kept)
    assert stream.push(first) == "" and stream.push(second) == ""
    assert stream.flush() == "\ufffd"  # the output ended mid-character: as the tokenizer decodes


def test_a_tokenizer_that_is_not_byte_level_keeps_the_windowed_decodes() -> None:
    words = HFTokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    assert byte_tables(words) is None
    # a byte-level decoder over a vocabulary outside the byte alphabet: not byte-level after all
    euro = HFTokenizer(models.BPE({"h": 0, "€": 1, "h€": 2}, [("h", "€")]))
    euro.decoder = decoders.ByteLevel()
    assert byte_tables(euro) is None


def test_tokenizer_streams_by_table_and_token_texts_agree(
    tokenizer_files_dir: Path, hf: HFTokenizer
) -> None:
    tokenizer = Tokenizer(tokenizer_files_dir)
    assert isinstance(tokenizer.text_stream(), ByteText)
    ids = [*range(300), *range(ENDOFTEXT_ID, NUM_IDS), 100_000, NUM_IDS + 5]
    assert tokenizer.token_texts(ids) == hf.decode_batch([[i] for i in ids], False)


def test_window_text_serves_any_decode() -> None:
    stream = WindowText(lambda ids: "".join(chr(ord("a") + i) for i in ids))
    assert [stream.push(i) for i in (0, 1, 2)] == ["a", "b", "c"] and stream.flush() == ""
