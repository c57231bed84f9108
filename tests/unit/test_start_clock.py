"""worker.runner.start_clock: a model runner's start, timed by phase and logged in one line."""

import gc
import logging
import re
import time

import pytest
import torch

from nanoserve.worker import LLM
from nanoserve.worker.runner.start_clock import StartClock
from tests.unit.hf_reference import make_hf_model


def test_phases_in_order_and_the_rest_as_other() -> None:
    clock = StartClock(torch.device("cpu"))
    with clock.phase("weights"):
        time.sleep(0.02)
    with clock.phase("graphs"):
        pass
    assert list(clock.phases) == ["weights", "graphs"]
    assert clock.phases["weights"] >= 0.02 and clock.phases["graphs"] < 0.02
    assert re.fullmatch(r"0\.\d s: weights 0\.0\d, graphs 0\.00, other 0\.\d\d", clock.summary())


def test_a_phase_counts_its_kernel_specialisations_and_gc_time() -> None:
    triton = pytest.importorskip("triton")
    clock = StartClock(torch.device("cpu"))
    with clock.phase("graphs"):
        for kernel in ("attn", "gemm"):  # what Triton calls as it specialises a kernel
            triton.knobs.runtime.jit_cache_hook(repr=kernel)
        garbage = [[i] for i in range(50_000)]  # something for the collector to walk
        gc.collect()
        del garbage
    with clock.phase("weights"):
        pass
    assert clock.kernels == {"graphs": 2, "weights": 0}
    assert clock.gc_s["graphs"] > 0 and clock.gc_s["weights"] == 0
    assert re.search(
        r"graphs \d\.\d\d \(2 kernels(, gc \d\.\d\d)?\), weights 0\.00,", clock.summary()
    )
    assert triton.knobs.runtime.jit_cache_hook is None  # the phase's watch is gone


def test_a_runner_logs_where_its_start_went(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = tmp_path_factory.mktemp("start_clock_model")
    make_hf_model(model_dir)
    with caplog.at_level(logging.INFO, logger="nanoserve.worker.runner.model_runner"):
        llm = LLM(model_dir, device="cpu", kvcache_block_size=16, num_kvcache_blocks=8)
    assert list(llm.model_runner.start_clock.phases) == ["device", "model", "weights", "kv_cache"]
    (line,) = [
        r.getMessage() for r in caplog.records if "model runner started in" in r.getMessage()
    ]
    assert "device " in line and "weights " in line and "kv_cache " in line and "other " in line
