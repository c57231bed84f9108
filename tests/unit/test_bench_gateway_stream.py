"""benchmarks/gateway_stream.py: the chat path's prompt words are one Qwen token each, so a chat
prompt made of N ids is N tokens (plus the template's), and which streamed chunks count as a token."""

import random

from tokenizers import Tokenizer

from nanoserve.benchmarks.gateway_stream import WORDS, _has_output, chat_text


def test_a_chat_prompt_of_n_ids_is_n_qwen_tokens(tokenizer_files_dir):
    tok = Tokenizer.from_file(str(tokenizer_files_dir / "tokenizer.json"))
    assert all(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in WORDS)
    rng = random.Random(0)
    for n in (1, 100, 1024):
        ids = [rng.randrange(151643) for _ in range(n)]
        assert len(tok.encode(chat_text(ids), add_special_tokens=False).ids) == n


def test_chunks_with_output():
    assert _has_output({"choices": [{"text": "a"}]}, chat=False)
    assert not _has_output({"choices": [{"text": ""}]}, chat=False)
    assert not _has_output({"choices": []}, chat=True)
    assert not _has_output({"choices": [{"delta": {"role": "assistant"}}]}, chat=True)
    for delta in ({"content": "x"}, {"reasoning_content": "y"}, {"tool_calls": [{}]}):
        assert _has_output({"choices": [{"delta": delta}]}, chat=True)
