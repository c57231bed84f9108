"""Output the test chooses, streamed through the real services: characters split across tokens, eos,
stop token ids and stop strings.

The random tiny model's output cannot be steered, so this module serves a "bigram" variant of it:
attention and MLP outputs are zeroed (each position's hidden state is its own embedding) and an
untied lm_head maps each token of a chosen cycle to the next one. Greedy decoding then follows the
cycle: one text whose emoji and rare CJK characters are split over 2-3 tokens, and one sentence
that ends with the eos token <|im_end|>.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nanoserve.client import Client
from nanoserve.tiny.model import IM_END_ID, make_tiny_model
from tests.e2e.processes import Pair, assert_idle, start_pair

pytestmark = pytest.mark.e2e

CYCLE_TEXT = "你好世界🙂🫠 龘!𝄞"
SENTENCE = "Stop here, then go."


def make_bigram_model(out: Path, tokenizer_dir: Path, cycles: list[list[int]]) -> Path:
    """The tiny model whose greedy output after token c[i] is c[i + 1] (wrapping), for each cycle c
    (no token may appear twice)."""
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
    for cycle in cycles:
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
def sentence(tokenizer) -> list[int]:
    """SENTENCE's ids and the eos id: after eos comes the sentence again."""
    return [*tokenizer.encode(SENTENCE, add_special_tokens=False).ids, IM_END_ID]


@pytest.fixture(scope="module")
def bigram_services(tmp_path_factory, tiny_model_dir: Path, cycle, sentence) -> Iterator[Pair]:
    assert not set(cycle) & set(sentence)
    model = make_bigram_model(tmp_path_factory.mktemp("bigram"), tiny_model_dir, [cycle, sentence])
    pair = start_pair(model)
    yield pair
    pair.stop()


def stream(address: str, prompt: list[int], max_tokens: int) -> tuple[list[str], list[int]]:
    with Client(address, timeout=30) as client:
        chunks = list(client.generate_stream(prompt, temperature=0, max_tokens=max_tokens))
    assert chunks[-1].finish_reason == "length"
    return [c.text for c in chunks], [t for c in chunks for t in c.token_ids]


@pytest.fixture(scope="module")
def client(bigram_services) -> Iterator[Client]:
    with Client(bigram_services.frontend.address, timeout=30) as client:
        yield client


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


def test_eos_ends_the_request(client, sentence) -> None:
    done = client.generate([IM_END_ID], temperature=0, max_tokens=50)
    assert done.token_ids == sentence  # the eos id is reported, its text is not
    assert done.text == SENTENCE
    assert (done.finish_reason, done.matched_stop_token_id, done.matched_stop) == (
        "stop",
        IM_END_ID,
        None,
    )
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (1, len(sentence))


def test_ignore_eos_and_special_tokens(client, sentence) -> None:
    n = 2 * len(sentence)
    done = client.generate([IM_END_ID], temperature=0, max_tokens=n, ignore_eos=True)
    assert done.token_ids == sentence * 2
    assert (done.text, done.finish_reason) == (SENTENCE * 2, "length")
    shown = client.generate(
        [IM_END_ID], temperature=0, max_tokens=n, ignore_eos=True, skip_special_tokens=False
    )
    assert shown.text == (SENTENCE + "<|im_end|>") * 2


def test_min_tokens_passes_over_eos(client, sentence) -> None:
    # vLLM: eos cannot be sampled before min_tokens (it used to be sampled, only not obeyed), so
    # where the model wants eos it takes its next best token and goes on
    min_tokens = len(sentence) + 1
    done = client.generate([IM_END_ID], temperature=0, max_tokens=50, min_tokens=min_tokens)
    assert done.token_ids[: len(sentence) - 1] == sentence[:-1]
    assert len(done.token_ids) >= min_tokens and IM_END_ID not in done.token_ids[:min_tokens]
    assert done.text.startswith(SENTENCE)


def test_stop_token_ids(client, sentence, tokenizer) -> None:
    then = tokenizer.encode(" then", add_special_tokens=False).ids[0]
    done = client.generate([IM_END_ID], temperature=0, max_tokens=50, stop_token_ids=[then])
    assert done.token_ids == sentence[: sentence.index(then) + 1]
    assert (done.text, done.finish_reason, done.matched_stop_token_id) == (
        "Stop here,",
        "stop",
        then,
    )


@pytest.mark.parametrize(
    ("stop", "include", "text"),
    [
        ("then", False, "Stop here, "),
        ("then", True, "Stop here, then"),
        ("re, th", False, "Stop he"),  # spans three tokens
        (".", True, "Stop here, then go."),
        ("absent", False, SENTENCE),  # eos ends it
    ],
)
def test_stop_strings(client, bigram_services, stop, include, text) -> None:
    chunks = list(
        client.generate_stream(
            [IM_END_ID],
            temperature=0,
            max_tokens=50,
            stop=[stop],
            include_stop_str_in_output=include,
        )
    )
    assert "".join(c.text for c in chunks) == text
    last = chunks[-1]
    assert last.finish_reason == "stop"
    assert last.matched_stop == (None if stop == "absent" else stop)
    assert_idle(bigram_services.worker.address)  # the frontend ended the worker's request
