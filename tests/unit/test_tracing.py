"""nanoserve.tracing's edges: a caller's traceparent is bounded and checked before it is used (a
malformed one starts a new trace, never an error), and with no endpoint nothing of OpenTelemetry is
imported by any service (tracing off costs nothing)."""

import subprocess
import sys
import time

import pytest

from nanoserve.tracing import (
    MAX_TRACEPARENT_CHARS,
    traceparent_from,
    traceparent_in,
    tracer_for,
    wall_ns,
    wall_ns_of_monotonic,
)

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "value",
    [GOOD, GOOD.upper(), f"  {GOOD} ", GOOD.encode(), GOOD[:-2] + "00", "01" + GOOD[2:] + "-0a1b"],
)
def test_well_formed_traceparents_are_kept(value) -> None:
    assert traceparent_from(value) is not None
    assert traceparent_from(value)[2:19] == "-0af7651916cd43dd"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "ff" + GOOD[2:],  # version ff is invalid
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",  # all-zero span id
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",  # short span id
        GOOD.replace("a", "g"),
        "x" * (MAX_TRACEPARENT_CHARS + 1),
        GOOD + "-0a1b",  # version 00 has exactly four fields
        "01" + GOOD[2:] + "-" + "0" * 100,  # past the bound
        "é" * 20,
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + b"\xff",
    ],
)
def test_malformed_traceparents_are_dropped(value) -> None:
    assert traceparent_from(value) is None


class Unwalkable(str):
    """A header whose length is all that may be read of it."""

    def __getattribute__(self, name: str):
        raise AssertionError(f"{name} was called on an oversized header")


def test_a_huge_header_is_refused_before_it_is_scanned() -> None:
    assert traceparent_from(Unwalkable("00-" + "a" * 1_000_000)) is None


def test_traceparent_in_reads_grpc_metadata() -> None:
    assert traceparent_in((("authorization", "Bearer x"), ("traceparent", GOOD))) == GOOD
    assert traceparent_in((("traceparent", "nope"),)) is None
    assert traceparent_in(None) is None


def test_clock_readings_become_epoch_nanoseconds() -> None:
    now = time.time_ns()
    assert abs(wall_ns(time.perf_counter()) - now) < 50_000_000
    assert abs(wall_ns_of_monotonic(time.monotonic() - 1.0) - (now - 1_000_000_000)) < 50_000_000


def test_no_endpoint_no_tracer() -> None:
    assert tracer_for("nanoserve-frontend", "") is None


def test_tracing_off_imports_no_opentelemetry() -> None:
    """Every service's modules load without the SDK or its exporter, and a frontend servicer and a worker
    AsyncEngine's tracer stay None without an endpoint."""
    code = """
import sys
import nanoserve.frontend.server, nanoserve.frontend.request
import nanoserve.frontend.gateway.__main__, nanoserve.frontend.gateway.app
import nanoserve.worker.service.server, nanoserve.worker.core.engine_core, nanoserve.worker.service.async_engine
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.worker.config import WorkerConfig
from nanoserve.tracing import tracer_for
for config in (FrontendConfig(model="tiny"), GatewayConfig(), WorkerConfig(model="tiny")):
    assert tracer_for("x", config.otlp_traces_endpoint) is None
# (the API alone may come with FastAPI, which imports it when installed)
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
