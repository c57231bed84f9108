"""The offline LLM takes text prompts (encoded with the model's tokenizer.json) as well as token ids."""

import shutil

import pytest

from nanoserve.text.tokenizer import Tokenizer
from nanoserve.worker import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _llm(model_dir):
    return LLM(str(model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=32)


def test_text_prompts_match_token_id_prompts(tiny_model_dir):
    llm = _llm(tiny_model_dir)
    tok = Tokenizer(tiny_model_dir)
    ids = tok.encode("Hello")
    by_text, by_ids = llm.generate(["Hello", ids], GREEDY, use_tqdm=False)
    assert by_text.prompt_token_ids == ids
    assert by_text.token_ids == by_ids.token_ids and len(by_text.token_ids) == 4
    assert by_text.text == tok.decode(by_text.token_ids)
    assert by_ids.text is None  # token ids in, token ids out
    # a bare string is one prompt
    (single,) = llm.generate("Hello", GREEDY, use_tqdm=False)
    assert single.token_ids == by_text.token_ids


def test_text_prompt_without_tokenizer_is_a_clear_error(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "tokenizer.json").unlink()
    llm = _llm(model_dir)
    with pytest.raises(ValueError, match="text prompts need a tokenizer.json.*token ids"):
        llm.generate(["Hello"], GREEDY, use_tqdm=False)
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids  # ids still work


def test_text_follows_detokenize_and_skip_special_tokens(tiny_model_dir):
    llm = _llm(tiny_model_dir)
    tok = Tokenizer(tiny_model_dir)
    end = tok.token_to_id("<|im_end|>")  # a special token: only its ids are allowed
    forced = dict(temperature=0.0, max_tokens=2, ignore_eos=True, allowed_token_ids=[end])
    default, kept, ids_only = llm.generate(
        ["Hello"] * 3,
        [
            SamplingParams(**forced),
            SamplingParams(**forced, skip_special_tokens=False),
            SamplingParams(**forced, detokenize=False),
        ],
        use_tqdm=False,
    )
    assert default.token_ids == kept.token_ids == ids_only.token_ids == [end, end]
    assert default.text == "" and kept.text == "<|im_end|><|im_end|>"
    assert ids_only.text is None  # asked for ids only
