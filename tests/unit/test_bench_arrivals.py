"""benchmarks/arrivals.py: Poisson arrivals fed straight into the engine. Its account of token gaps
and step kinds, and a replay on the tiny model with decode lookahead on CPU: every request gets all
its tokens, and no mixed step drops a decode forwarded ahead."""

import pytest

from nanoserve.benchmarks import arrivals, workload
from nanoserve.benchmarks.stalls import StallWatch
from nanoserve.worker import LLM


def test_account_of_gaps_and_steps():
    reqs = [workload.Request("a", [1], 3, 0.0), workload.Request("b", [1], 2, 0.0)]
    # a: tokens at 1, 2, 4 s; b: at 2, 4 s. The 2 s gaps end in the mixed step at 4 s.
    token_times = {"a": [1.0, 2.0, 4.0], "b": [2.0, 4.0]}
    ended_by = {1.0: "mixed", 2.0: "ahead", 4.0: "mixed+wasted"}
    steps = [("mixed", 0.5, 1, 100), ("ahead", 0.25, 2, 0), ("mixed+wasted", 1.0, 2, 50)]
    res = arrivals._account(reqs, {"a": 0.5, "b": 1.0}, token_times, ended_by, steps, wall=5.0)
    assert res["output_tok_s"] == 1  # 5 tokens in 5 s
    assert res["itl_ms"]["n"] == 3 and res["itl_ms"]["p50"] == 2000.0
    assert res["itl_p99_over_p50"] == 1.0
    assert res["ttft_ms"]["p50"] == 750.0  # 0.5 s and 1.0 s
    assert res["slowest_1pct_of_gaps_end_in"] == {"mixed+wasted": 1.0}
    assert res["steps"]["mixed"] == dict(res["steps"]["mixed"], seqs=1.0, prompt_tokens=100)
    assert res["steps"]["mixed+wasted"]["ms"]["p50"] == 1000.0
    assert [(x["index"], x["kind"], x["ms"]) for x in res["slowest_steps"]] == [
        (2, "mixed+wasted", 1000.0),
        (0, "mixed", 500.0),
        (1, "ahead", 250.0),
    ]


def test_stall_watch_sees_gc_and_triton_specialisations_and_restores_the_hooks():
    import gc

    triton = pytest.importorskip("triton")
    seen: list[str] = []
    before = triton.knobs.runtime.jit_cache_hook = lambda *a, **kw: seen.append(kw["repr"])
    callbacks = list(gc.callbacks)
    try:
        with StallWatch(slow_gc_ms=0.0) as watch:
            gc.collect()
            triton.knobs.runtime.jit_cache_hook(repr="kernel_a")  # as Triton calls it
        assert triton.knobs.runtime.jit_cache_hook is before  # restored
        assert seen == ["kernel_a"]  # the hook before it still ran
    finally:
        triton.knobs.runtime.jit_cache_hook = None
    s = watch.summary()
    assert s["triton_specialised"] == 1 and s["triton_kernels"] == ["kernel_a"]
    assert s["gc_pauses"] >= 1 and s["gc_slow"] == s["gc_pauses"]
    assert s["cuda_mallocs"] == 0
    assert gc.callbacks == callbacks  # its GC callback removed


def test_replay_takes_every_forward_ahead(tiny_model_dir):
    llm = LLM(
        tiny_model_dir, device="cpu", decode_lookahead=True, max_model_len=256, max_num_seqs=16
    )
    vocab = llm.model_config.vocab_size
    shape = workload.lengths(16, 4, 24, 8, 24, seed=3)
    reqs = workload.build("t", shape, vocab, rate=40.0, seed=3)
    res = arrivals.replay(llm, reqs, temperature=0.0)
    assert res["itl_ms"]["n"] == sum(o - 1 for _, o in shape)  # every token of every request
    assert "mixed+wasted" not in res["steps"]
    assert res["steps"]["ahead"]["ms"]["n"] > 0
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    llm.shutdown()


def test_gpu_table_counts_the_engine_cores_stall_warnings(tmp_path, capsys):
    from nanoserve.benchmarks import gpu_table

    (tmp_path / "serving.log").write_text(
        "[worker] WARNING a Triton kernel was specialised while serving (...): decode_attention\n"
        "[worker] WARNING a Triton kernel was specialised while serving (...): sample_rows\n"
        "[worker] WARNING a garbage-collector pass (generation 2, 0 collected) held it 31.0 ms\n"
        "=== serving: exit 0 after 3 s\n"
    )
    (tmp_path / "quiet.log").write_text("=== quiet: exit 0 after 1 s\n")
    gpu_table.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert (
        "engine core stalls while serving: 2 x 'specialised while serving', "
        "1 x 'garbage-collector pass'"
    ) in out
    assert out.count("engine core stalls") == 1
