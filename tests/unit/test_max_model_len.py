"""--max-model-len: unset, it is the model's max_position_embeddings, lowered to what the KV cache
holds, and a log line says which; set, it is capped the same way (a warning when the cache lowers it)."""

import logging

import pytest

from nanoserve.tiny.model import make_tiny_model
from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.config import EngineConfig

LOGGER = "nanoserve.worker.core.llm_engine"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):  # trained for 512 positions
    return make_tiny_model(
        tmp_path_factory.mktemp("len512"),
        vocab_size=512,
        max_position_embeddings=512,
        with_tokenizer=False,
    )


def _llm(model_dir, blocks: int, **kw) -> LLM:
    return LLM(str(model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=blocks, **kw)


def test_unset_is_the_models_max_position_embeddings(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        llm = _llm(model_dir, blocks=64)  # 1024 slots: the cache does not limit it
    assert llm.max_model_len == 512
    assert "max_model_len 512: the model's max_position_embeddings" in caplog.text
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (out,) = llm.generate([[3] * 500], sp, use_tqdm=False)  # fills the context exactly
    assert len(out.token_ids) == 12 and out.finish_reason == "length"


def test_unset_is_lowered_to_the_kv_cache(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        llm = _llm(model_dir, blocks=8)  # 128 slots
    assert llm.max_model_len == 128
    assert "max_model_len 128: the model's max_position_embeddings (512) lowered" in caplog.text
    with pytest.raises(ValueError, match="max_model_len is 128"):
        llm.generate([[3] * 128], SamplingParams(max_tokens=1), use_tqdm=False)


def test_set_is_capped_by_the_model_and_the_cache(model_dir, caplog):
    assert _llm(model_dir, blocks=64, max_model_len=100).max_model_len == 100
    assert _llm(model_dir, blocks=64, max_model_len=4096).max_model_len == 512
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _llm(model_dir, blocks=4, max_model_len=100).max_model_len == 64
    assert "max_model_len lowered from 100 to 64" in caplog.text


def test_config_default_means_from_the_model():
    assert EngineConfig().max_model_len == 0
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig(max_model_len=-1)
