"""Characters split across tokens, streamed through the real services.

The random tiny model rarely emits the byte-fragment tokens of one character in a row, so this module
serves a "bigram" variant of it: attention and MLP outputs are zeroed (each position's hidden state is
its own embedding) and an untied lm_head maps each token of a chosen text to the next one. Greedy
decoding then cycles through that text, whose emoji and rare CJK characters are split over 2-3 tokens.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shared.client import Client
from shared.tiny_model import make_tiny_model
from tests.e2e.conftest import Pair, start_pair

pytestmark = pytest.mark.e2e

CYCLE_TEXT = "你好世界🙂🫠 龘!𝄞"


def make_bigram_model(out: Path, tokenizer_dir: Path, cycle: list[int]) -> Path:
    """The tiny model whose greedy output after token cycle[i] is cycle[i + 1] (wrapping)."""
    from safetensors.numpy import load_file, save_file

    make_tiny_model(out, tie_word_embeddings=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # same files: same tokenizer digest
        shutil.copyfile(tokenizer_dir / name, out / name)
    weights = load_file(out / "model.safetensors")
    for name in weights:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = np.zeros_like(weights[name])
    weights["model.norm.weight"] = np.ones_like(weights["model.norm.weight"])
    embed = weights["model.embed_tokens.weight"]  # (vocab, hidden)
    lm_head = np.zeros_like(weights["lm_head.weight"])
    for token, next_token in zip(cycle, cycle[1:] + cycle[:1]):
        lm_head[next_token] = 50.0 * embed[token] / np.linalg.norm(embed[token])
    weights["lm_head.weight"] = lm_head
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def cycle(tokenizer) -> list[int]:
    ids = tokenizer.encode(CYCLE_TEXT, add_special_tokens=False).ids
    assert len(set(ids)) == len(ids), "a bigram model needs distinct tokens"
    split = [i for i in ids if "\ufffd" in tokenizer.decode([i])]
    assert len(split) >= 4, "the text must hold characters split over several tokens"
    return ids


@pytest.fixture(scope="module")
def bigram_services(tmp_path_factory, tiny_model_dir: Path, cycle: list[int]) -> Iterator[Pair]:
    model = make_bigram_model(tmp_path_factory.mktemp("bigram"), tiny_model_dir, cycle)
    pair = start_pair(model)
    yield pair
    pair.stop()


def stream(address: str, prompt: list[int], max_tokens: int) -> tuple[list[str], list[int]]:
    with Client(address, timeout=30) as client:
        chunks = list(client.generate_stream(prompt, temperature=0, max_tokens=max_tokens))
    assert chunks[-1].finish_reason == "length"
    return [c.text for c in chunks], [t for c in chunks for t in c.token_ids]


def test_split_characters_stream_whole(bigram_services, cycle, tokenizer) -> None:
    n = len(cycle)
    deltas, ids = stream(bigram_services.frontend.address, [cycle[-1]], 3 * n)
    assert ids == cycle * 3
    assert "".join(deltas) == CYCLE_TEXT * 3
    # text is released at character boundaries only: no U+FFFD for a character still in progress
    assert not any("\ufffd" in d for d in deltas)


def test_stream_cut_anywhere_matches_decode(bigram_services, cycle, tokenizer) -> None:
    """Ending after any token, mid-character included: the deltas concatenate to the decode of all
    ids, and each prefix of them is a prefix of that decode."""
    for max_tokens in [*range(1, len(cycle) + 1), len(cycle) + 4, len(cycle) + 8]:
        deltas, ids = stream(bigram_services.frontend.address, [cycle[-1]], max_tokens)
        assert ids == (cycle * 2)[:max_tokens]
        full = tokenizer.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) == full, max_tokens
        for k in range(1, len(deltas)):
            assert full.startswith("".join(deltas[:k])), (max_tokens, deltas)
