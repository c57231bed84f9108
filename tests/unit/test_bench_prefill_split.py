"""benchmarks.prefill's host split: a step that no prefill graph runs (here: the CPU) gives no
split and leaves no KV block taken; a diagnostic that fails reports its error in place of figures;
its default flags make a valid engine config."""

from pathlib import Path

from nanoserve.benchmarks import prefill
from nanoserve.worker import LLM


def test_no_graph_no_split_and_no_block_kept(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    try:
        free = len(llm.block_manager.free_block_ids)
        assert prefill.host_split_us(llm, list(range(5, 40))) == {}
        assert len(llm.block_manager.free_block_ids) == free
    finally:
        llm.shutdown()


def test_a_failing_diagnostic_is_reported_not_raised() -> None:
    def boom() -> dict:
        raise RuntimeError("no graph")

    assert prefill.guarded(boom) == "failed: RuntimeError: no graph"
    assert prefill.guarded(lambda: {"a": 1}) == {"a": 1}


def test_the_default_flags_make_a_valid_engine_config() -> None:
    """The SDPA minimum defaults to the engine's (EngineConfig has slots: its class attribute is a
    descriptor, which once reached the config and failed the benchmark's default run on a GPU)."""
    from nanoserve.worker.config import EngineConfig

    args = prefill.build_parser().parse_args([])
    assert args.prefill_sdpa_min_tokens == EngineConfig().prefill_sdpa_min_tokens
    EngineConfig(prefill_sdpa_min_tokens=args.prefill_sdpa_min_tokens)
