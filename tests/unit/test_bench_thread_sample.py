"""benchmarks.thread_sample reads each thread's CPU over an interval from /proc: a busy thread of
this process shows up, by the name frame_io.name_os_thread gave its OS thread, near the top."""

import threading
import time
from pathlib import Path

from nanoserve.benchmarks import thread_sample
from nanoserve.worker.core.frame_io import name_os_thread


def test_a_busy_thread_is_listed_by_name() -> None:
    stop = threading.Event()

    def spin() -> None:
        name_os_thread()  # as the engine core's pipe threads do
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, name="busy-thread", daemon=True)
    thread.start()
    prefix = Path("/proc/self/comm").read_text().strip()
    try:
        before, t0 = thread_sample.snapshot(prefix), time.monotonic()
        time.sleep(0.3)
        after, t1 = thread_sample.snapshot(prefix), time.monotonic()
    finally:
        stop.set()
        thread.join(5)
    lines = thread_sample.busiest(before, after, t1 - t0, top=3)
    busy = next(line for line in lines if line.endswith("busy-thread"))
    assert float(busy.split("%")[0].split()[-1]) > 10  # spinning: well above idle
