"""The worker's stats line: its format, and the windows that open with work and close when due."""

import logging

from nanoserve.worker.core.stats_log import Load, StatsLogger, format_stats

LOGGER = "nanoserve.worker.core.stats_log"


def load(t, prompt=0, generated=0, running=0, waiting=0, free=100, hit=0.0, preempted=0) -> Load:
    return Load(t, prompt, generated, running, waiting, free, 100, hit, preempted, 0, 0)


def test_format_stats():
    start = load(100.0, prompt=1000, generated=50)
    end = Load(
        *load(
            110.0, prompt=3000, generated=1050, running=3, waiting=2, free=75, hit=0.4, preempted=1
        )
    )
    assert format_stats(start, end) == (
        "running 3, waiting 2, KV cache 25.0% used, prompt 200.0 tok/s, generation 100.0 tok/s, "
        "prefix cache hit rate 40.0%, preemptions 1"
    )


def test_a_line_per_interval_while_there_is_work(caplog, monkeypatch):
    stats = StatsLogger(10.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        stats.observe(load(0.0))  # idle, no window open: nothing
        stats.begin(lambda: load(0.0, running=1))
        stats.observe(load(5.0, generated=50, running=1))  # not due yet
        assert not caplog.records
        stats.observe(load(10.0, generated=100, running=1))
        assert caplog.messages == [
            (
                "running 1, waiting 0, KV cache 0.0% used, prompt 0.0 tok/s, generation 10.0 tok/s, "
                "prefix cache hit rate 0.0%, preemptions 0"
            )
        ]
        # still working: the next window opened where this one closed
        monkeypatch.setattr("time.monotonic", lambda: 14.0)
        assert stats.idle_wait_s() == 6.0
        stats.observe(load(20.0, generated=300))  # the work ended: a last line, then silence
        assert "generation 20.0 tok/s" in caplog.messages[-1]
        assert stats.idle_wait_s() is None
        stats.observe(load(100.0, generated=300))
    assert len(caplog.messages) == 2


def test_interval_zero_is_off():
    stats = StatsLogger(0.0)
    stats.begin(lambda: load(0.0, running=1))
    assert stats.start is None and stats.idle_wait_s() is None
