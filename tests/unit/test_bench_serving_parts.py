"""The serving benchmark's parts that need no service: percentiles, buckets, the workload, the
worker flags that carry the offline engine settings, and help text on every bench flag."""

import argparse
import math

import pytest

from nanoserve.benchmarks import engine, roofline, serving, workload
from nanoserve.benchmarks.stats import bucket_label, percentile, summarize, summarize_by_bucket
from nanoserve.config import add_config_args, config_from_args
from nanoserve.worker.config import EngineConfig, WorkerConfig


def test_percentile_interpolates_between_ranks_like_numpy():
    np = pytest.importorskip("numpy")
    values = sorted([3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0])
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_scales_and_names_the_percentiles():
    s = summarize([0.001 * i for i in range(1, 101)], scale=1000)  # 1..100 ms
    assert s == {"n": 100, "p50": 50.5, "p90": 90.1, "p99": 99.01, "max": 100.0, "mean": 50.5}
    assert summarize([]) == {"n": 0}


def test_buckets_split_at_the_edges():
    edges = [256, 512]
    assert [bucket_label(k, edges) for k in (100, 255, 256, 511, 512, 4000)] == [
        "<256",
        "<256",
        "256-511",
        "256-511",
        ">=512",
        ">=512",
    ]
    got = summarize_by_bucket([(600, 3.0), (100, 1.0), (300, 2.0), (120, 5.0)], edges)
    assert list(got) == ["<256", "256-511", ">=512"]
    assert got["<256"]["n"] == 2 and got["<256"]["max"] == 5.0
    assert list(summarize_by_bucket([(600, 1.0)], edges)) == [">=512"]  # empty buckets left out


def test_workload_lengths_and_ids_per_path():
    shape = workload.lengths(256, 100, 1024, 100, 1024)
    assert shape == workload.lengths(256, 100, 1024, 100, 1024)  # the same for every path
    assert all(100 <= p <= 1024 and 100 <= o <= 1024 for p, o in shape)
    a, b = workload.build("frontend", shape[:4], 1000), workload.build("worker", shape[:4], 1000)
    assert [len(r.prompt_token_ids) for r in a] == [p for p, _ in shape[:4]]
    assert [r.max_tokens for r in a] == [o for _, o in shape[:4]]
    assert a[0].prompt_token_ids != b[0].prompt_token_ids  # no prefix hits between paths
    assert all(0 <= t < 1000 for r in a for t in r.prompt_token_ids)
    assert len({r.request_id for r in a + b}) == 8


def test_poisson_arrivals_have_the_rate():
    assert workload.arrivals(5, math.inf) == [0.0] * 5
    times = workload.arrivals(4000, 16.0)
    assert times[0] == 0.0 and times == sorted(times)
    assert 4000 / times[-1] == pytest.approx(16.0, rel=0.05)
    with pytest.raises(ValueError):
        workload.arrivals(3, 0)


def test_worker_flags_carry_the_offline_engine_settings(tiny_model_dir):
    args = serving.build_parser().parse_args(
        [
            "--model",
            str(tiny_model_dir),
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "4096",
            "--gpu-memory-utilization",
            "0.5",
            "--tensor-parallel-size",
            "2",
            "--enforce-eager",
            "--no-decode-lookahead",
            "--device",
            "cpu",
        ]
    )
    settings = serving.engine_settings(args)
    parser = add_config_args(argparse.ArgumentParser(), WorkerConfig)
    worker = config_from_args(WorkerConfig, parser.parse_args(serving.worker_flags(settings)))
    for name in settings:
        assert getattr(worker, name) == settings[name], name
    assert settings["max_num_seqs"] == 64 and settings["decode_lookahead"] is False
    assert settings["enforce_eager"] is True and settings["tensor_parallel_size"] == 2
    again = serving.worker_flags(dict(settings, decode_lookahead=None, enforce_eager=False))
    worker = config_from_args(WorkerConfig, parser.parse_args(again))
    assert worker.decode_lookahead is None and worker.enforce_eager is False
    assert set(settings) == {f for f in EngineConfig.__dataclass_fields__}


@pytest.mark.parametrize(
    "build", [engine.build_parser, serving.build_parser, roofline.build_parser]
)
def test_every_bench_flag_has_help(build):
    parser = build()
    missing = [a.dest for a in parser._actions if not a.help or not a.help.strip()]
    assert not missing, f"flags without help: {missing}"


def test_the_load_generators_start_is_not_held_by_a_client_that_died_before_it():
    """A client process that dies before the start barrier (killed, or its imports failed) breaks
    the barrier at once, instead of the parent waiting out the barrier's 120 s timeout."""
    import multiprocessing as mp
    import os
    import time

    from nanoserve.benchmarks.loadgen import _start_together

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)  # the dead client and the parent
    dead = ctx.Process(target=os._exit, args=(3,), daemon=True)
    dead.start()
    t = time.monotonic()
    _start_together(barrier, [dead], timeout_s=60)
    assert time.monotonic() - t < 10 and dead.exitcode == 3 and barrier.broken
