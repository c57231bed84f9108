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


def test_two_spinners_on_one_cpu_each_wait_for_it() -> None:
    """Run-queue wait (schedstat): two busy processes held to one CPU take turns, so each spends
    a good part of the interval runnable but not running; the line shows that CPU."""
    import os
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"]
        )
        for _ in range(2)
    ]
    try:
        time.sleep(0.3)  # both started and pinned
        prefix = Path(f"/proc/{procs[0].pid}/comm").read_text().strip()
        before, t0 = thread_sample.snapshot(prefix), time.monotonic()
        time.sleep(0.5)
        after, t1 = thread_sample.snapshot(prefix), time.monotonic()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = thread_sample.busiest(before, after, t1 - t0, top=50, mhz=thread_sample.cpu_mhz())
    ours = [line for line in lines if int(line.split()[0]) in {p.pid for p in procs}]
    assert len(ours) == 2
    for line in ours:
        wait = float(line.split("wait")[1].split("%")[0])
        assert wait > 20, line  # ~50% each: the other holds the CPU
        assert f"cpu{cpu} " in line


def test_steal_is_read_for_every_cpu() -> None:
    """/proc/stat's steal ticks, one count a CPU (0 on bare metal), never decreasing."""
    import os

    first = thread_sample.cpu_steal()
    assert set(os.sched_getaffinity(0)) <= set(first)
    time.sleep(0.05)
    second = thread_sample.cpu_steal()
    assert all(second[c] >= first[c] >= 0 for c in first)
    line = thread_sample.busiest({}, {}, 1.0, 1, steal=(first, second))
    assert line == []  # no thread in both snapshots: nothing listed
