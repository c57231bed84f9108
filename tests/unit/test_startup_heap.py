"""nanoserve.startup_heap: what start-up left alive leaves the collector's passes."""

import gc
import logging

import pytest

from nanoserve.startup_heap import freeze_startup_heap


def test_freeze_moves_what_is_alive_out_of_the_collectors_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = [[i] for i in range(50_000)]  # start-up's long-lived objects
    try:
        with caplog.at_level(logging.DEBUG, logger="nanoserve.startup_heap"):
            freeze_startup_heap("frontend")
        assert gc.get_freeze_count() >= len(model)
        # a full pass now walks only objects made after the freeze: far fewer than the model's
        assert len(gc.get_objects()) < len(model) // 10
        served = [[i] for i in range(1_000)]  # what serving makes is collected as before
        assert len(gc.get_objects()) >= len(served)
        (line,) = [r.getMessage() for r in caplog.records]
        assert (
            line.startswith("frontend: ") and " objects frozen out of the garbage collector" in line
        )
    finally:
        gc.unfreeze()  # the other tests' objects are collected as usual
