"""What the engine core's step loop did during each one-stream probe of `bench serving` (issue 29's
slow probes): a thread samples the loop's Linux counters every 20 ms (/proc schedstat: time on a
CPU and time runnable but waiting for one; preemptions and sleeps; the CPU it ran on and that CPU's
steal time), and each probe's window
[sent, end] reads its share of them. A slow probe whose loop waited points at a thread placed on
its CPU; one whose loop ran the whole time points at the loop's own work.
"""

import bisect
import threading
import time
from pathlib import Path

from nanoserve.benchmarks.process_counters import process_tree
from nanoserve.benchmarks.thread_sample import TICK, ThreadRow, cpu_steal, read_thread

PROC = Path("/proc")


def engine_core_pid(worker_pid: int) -> int | None:
    """The worker's engine core: its child running `multiprocessing.spawn` (the tree's first)."""
    for pid in process_tree(worker_pid)[1:]:
        try:
            cmdline = (PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing" in cmdline and b"spawn" in cmdline:
            return pid
    return None


def read_loop(pid: int) -> ThreadRow | None:
    """The counters of the process's main thread (the engine core's step loop)."""
    return read_thread(PROC / str(pid) / "task" / str(pid))


class StepLoopWatch:
    """Samples read_loop(pid) every `interval_s` on a daemon thread until stop()."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.times: list[float] = []  # time.perf_counter() of each sample
        self.rows: list[ThreadRow] = []
        self.steals: list[dict[int, int]] = []  # each CPU's steal ticks at each sample
        self._stop = threading.Event()
        # a sample now and one at stop(), taken by the caller: every window in between has a
        # sample on each side even where the thread got no CPU (a 2-core CI box under a full
        # suite read none for every probe once, 2026-12-06)
        self._sample()
        self._thread = threading.Thread(target=self._run, name="step-loop-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> bool:
        """One sample appended; False once the loop's process is gone."""
        row = read_loop(self.pid)
        if row is None:
            return False
        self.times.append(time.perf_counter())
        self.rows.append(row)
        self.steals.append(cpu_steal())
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s) and self._sample():
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if not self._thread.is_alive():  # (else it may still append: leave the samples as they are)
            self._sample()

    def window(self, start: float, end: float) -> dict | None:
        """The loop's CPU %, run-queue wait %, preemptions, sleeps, its CPUs' steal % (the
        hypervisor's) and the CPUs between the samples that enclose [start, end] (perf_counter
        times; a window shorter than the interval reads one interval); None without two."""
        i = max(0, bisect.bisect_right(self.times, start) - 1)  # the last sample at or before
        j = min(len(self.times) - 1, bisect.bisect_left(self.times, end))  # the first at or after
        if j <= i:
            return None
        wall = self.times[j] - self.times[i]
        a, b = self.rows[i], self.rows[j]
        # each interval's steal on the CPU the loop was on at its end (ticks of 1/TICK s)
        stolen = sum(
            self.steals[k + 1].get(self.rows[k + 1].psr, 0)
            - self.steals[k].get(self.rows[k + 1].psr, 0)
            for k in range(i, j)
        )
        return dict(
            cpu_pct=round(100 * (b.cpu_s - a.cpu_s) / wall, 1),
            wait_pct=round(100 * (b.wait_s - a.wait_s) / wall, 1),
            preemptions=b.involuntary - a.involuntary,
            sleeps=b.voluntary - a.voluntary,
            steal_pct=round(100 * stolen / TICK / wall, 1),
            cpus=sorted({row.psr for row in self.rows[i : j + 1]}),
        )
