"""worker/runner/serving_stalls.py: once the engine core serves, a Triton specialisation and a long
garbage-collector pass are each logged as a warning; uninstalling puts the hooks back."""

import gc
import logging

import pytest

from nanoserve.worker.runner.serving_stalls import log_serving_stalls


def test_a_long_gc_pass_is_a_warning_and_a_short_one_is_not(caplog):
    caplog.set_level(logging.WARNING, "nanoserve.worker.runner.serving_stalls")
    callbacks = list(gc.callbacks)
    uninstall = log_serving_stalls(slow_gc_ms=0.0)  # every pass counts as long
    try:
        gc.collect()
    finally:
        uninstall()
    assert any("garbage-collector pass (generation 2" in r.message for r in caplog.records)
    caplog.clear()
    uninstall = log_serving_stalls(slow_gc_ms=60_000.0)
    try:
        gc.collect()
    finally:
        uninstall()
    assert not caplog.records
    assert gc.callbacks == callbacks  # each uninstall removed its GC callback


def test_a_triton_specialisation_is_a_warning_and_the_hook_before_still_runs(caplog):
    triton = pytest.importorskip("triton")
    caplog.set_level(logging.WARNING, "nanoserve.worker.runner.serving_stalls")
    seen: list[str] = []

    def before(*args, **kwargs):
        seen.append(kwargs["repr"])

    triton.knobs.runtime.jit_cache_hook = before
    try:
        uninstall = log_serving_stalls()
        triton.knobs.runtime.jit_cache_hook(repr="decode_attention[...]")  # as Triton calls it
        uninstall()
        assert triton.knobs.runtime.jit_cache_hook is before
    finally:
        triton.knobs.runtime.jit_cache_hook = None
    assert seen == ["decode_attention[...]"]
    (record,) = caplog.records
    assert "specialised while serving" in record.message and "decode_attention" in record.message


def test_a_specialisation_is_named_by_its_arguments_not_its_options():
    from nanoserve.worker.runner.serving_stalls import specialisation

    triton_repr = (
        "_sample_chunk_kernel[num_warps=4, num_ctas=1, num_stages=3, enable_fp_fusion=True, "
        "launch_cooperative_grid=False](logits_ptr: ('*bf16', 'D'), stride: ('i32', 'D'), "
        "BLOCK: ('constexpr', 4096), ALL_GREEDY: ('constexpr', False))"
    )
    assert specialisation(triton_repr) == (
        "_sample_chunk_kernel(logits_ptr: ('*bf16', 'D'), stride: ('i32', 'D'), "
        "BLOCK: ('constexpr', 4096), ALL_GREEDY: ('constexpr', False))"
    )
    assert specialisation("decode_attention[...]") == "decode_attention[...]"
    assert len(specialisation("k[o](" + "a" * 5000 + ")")) == 600
