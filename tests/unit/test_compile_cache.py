"""The engine's compile_cache_dir becomes Triton's cache directory (TRITON_CACHE_DIR) before any
kernel compiles; left empty, Triton keeps its own default."""

import os
from pathlib import Path

import pytest

from nanoserve.worker import LLM
from nanoserve.worker.config import EngineConfig


def test_compile_cache_dir_sets_tritons_cache(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triton

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    LLM(tiny_model_dir, device="cpu", num_kvcache_blocks=8)
    assert "TRITON_CACHE_DIR" not in os.environ
    cache = tmp_path / "triton"
    LLM(tiny_model_dir, device="cpu", num_kvcache_blocks=8, compile_cache_dir=str(cache))
    assert os.environ["TRITON_CACHE_DIR"] == str(cache)
    assert triton.knobs.cache.dir == str(cache)


def test_prefill_graph_max_tokens_is_validated() -> None:
    with pytest.raises(ValueError, match="prefill_graph_max_tokens"):
        EngineConfig(prefill_graph_max_tokens=-1)
    assert EngineConfig(prefill_graph_max_tokens=0).prefill_graph_max_tokens == 0
