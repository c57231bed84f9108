"""benchmarks.step_loop_watch: a probe's window reads the step loop's share of CPU and of run-queue
wait between the samples inside it, and the engine core is found as the worker's spawned child."""

import os
import subprocess
import sys
import time

from nanoserve.benchmarks.step_loop_watch import StepLoopWatch, read_loop
from nanoserve.benchmarks.thread_sample import TICK, ThreadRow


def test_window_reads_the_samples_inside_it() -> None:
    watch = StepLoopWatch.__new__(StepLoopWatch)  # no thread: samples given
    watch.times = [0.0, 1.0, 2.0, 3.0]
    # (s on a CPU, s waiting, last CPU, sleeps, preemptions, name)
    watch.rows = [
        ThreadRow(0.0, 0.0, 3, 0, 0, "loop"),
        ThreadRow(0.5, 0.25, 3, 10, 4, "loop"),
        ThreadRow(1.4, 0.3, 5, 17, 9, "loop"),
        ThreadRow(0.0, 0.0, 0, 0, 0, "loop"),
    ]
    # steal ticks by CPU: CPU 5 (where the loop was at sample 2) lost 10 ticks between 1 and 2
    watch.steals = [{3: 0, 5: 0}, {3: 4, 5: 100}, {3: 50, 5: 110}, {}]
    w = watch.window(1.0, 2.0)  # samples 1 and 2
    assert w == dict(
        cpu_pct=90.0,
        wait_pct=5.0,
        preemptions=5,
        sleeps=7,
        steal_pct=round(100 * 10 / TICK, 1),
        cpus=[3, 5],
    )
    assert watch.window(1.2, 1.8) == w  # inside one interval: that interval
    assert watch.window(3.5, 4.0) is None  # past the last sample: nothing encloses it


def test_a_busy_thread_is_watched() -> None:
    watch = StepLoopWatch(os.getpid(), interval_s=0.002)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # this main thread: busy
        pass
    t1 = time.perf_counter()
    watch.stop()
    w = watch.window(t0, t1)
    assert w is not None and w["cpu_pct"] > 30 and 0 <= w["wait_pct"] <= 100, w
    assert read_loop(os.getpid()) is not None


def test_a_window_inside_the_watch_is_read_even_if_its_thread_never_sampled(monkeypatch) -> None:
    """The watch samples once when made and once when stopped, on the caller's thread: a probe
    between the two has a sample on each side however little CPU the sampling thread got (on a
    2-core CI box under a full suite every probe once read None)."""
    monkeypatch.setattr(StepLoopWatch, "_run", lambda self: None)  # a thread that never samples
    watch = StepLoopWatch(os.getpid(), interval_s=0.002)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        pass
    t1 = time.perf_counter()
    watch.stop()
    assert len(watch.times) == 2
    w = watch.window(t0, t1)
    assert w is not None and w["cpu_pct"] > 0, w


CHILD = """
import multiprocessing as mp, os
from nanoserve.benchmarks.step_loop_watch import engine_core_pid

def idle(q):
    q.get()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=idle, args=(q,))
    child.start()
    print(child.pid, engine_core_pid(os.getpid()))
    q.put(None)
    child.join(10)
"""


def test_the_spawned_child_is_the_engine_core(tmp_path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    child, found = out.stdout.split()
    assert child == found
