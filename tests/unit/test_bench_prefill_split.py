"""benchmarks.prefill's host split: a step that no prefill graph runs (here: the CPU) gives no
split and leaves no KV block taken; a diagnostic that fails reports its error in place of figures."""

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
