"""`python -m nanoserve.benchmarks.thread_sample`: every --interval seconds, the busiest threads of
the machine's Python processes over that interval, from Linux /proc: CPU %, time spent runnable
but waiting for a CPU (%), the CPU each last ran on and that CPU's clock, context switches
(voluntary: it slept; involuntary: it was preempted) and its thread name (ours are named:
core-outbox, core-inbox, core-heartbeat, tokenizer_0 ...). For the one-stream probes of issue 29
(gpu_run.sh onestream): where a slow probe's host time went. Runs until killed.
"""

import argparse
import os
import time
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")


class ThreadRow(NamedTuple):
    cpu_s: float  # on a CPU (schedstat's ns; stat's user + system ticks without it)
    wait_s: float  # runnable, waiting on a run queue (schedstat; 0 where the kernel keeps none)
    psr: int  # the CPU it last ran on
    voluntary: int  # context switches: it slept
    involuntary: int  # context switches: it was preempted
    name: str


def read_thread(task: Path) -> ThreadRow | None:
    """One thread's counters; None once it has exited."""
    try:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        status = (task / "status").read_text().splitlines()
        name = (task / "comm").read_text().strip()
    except OSError:  # exited meanwhile
        return None
    # after the ")": state is field 3 of stat, utime 14, stime 15, processor 39 (1-based)
    cpu_s, wait_s = (int(fields[11]) + int(fields[12])) / TICK, 0.0
    try:  # on-CPU ns and run-queue wait ns (finer than stat's ticks), time slices
        on_cpu, wait = (task / "schedstat").read_text().split()[:2]
        cpu_s, wait_s = int(on_cpu) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        pass
    switches = {
        k: int(v) for k, v in (line.split(":\t") for line in status if "ctxt_switches" in line)
    }
    return ThreadRow(
        cpu_s,
        wait_s,
        int(fields[36]),
        switches.get("voluntary_ctxt_switches", 0),
        switches.get("nonvoluntary_ctxt_switches", 0),
        name,
    )


def snapshot(prefix: str) -> dict[tuple[int, int], ThreadRow]:
    """Every thread of the processes whose command starts with `prefix`, by (pid, tid)."""
    out = {}
    for proc in PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith(prefix):
                continue
            tasks = list((proc / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            if (row := read_thread(task)) is not None:
                out[(int(proc.name), int(task.name))] = row
    return out


def cpu_steal() -> dict[int, int]:
    """Each CPU's steal ticks so far (/proc/stat: time its hypervisor ran something else while
    this guest CPU had work; 0 on bare metal). A thread slowed with no run-queue wait of its own
    may have lost its CPU to the host."""
    out: dict[int, int] = {}
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and len(fields) > 7:
            out[int(name[3:])] = int(fields[7])
    return out


def cpu_mhz() -> dict[int, float]:
    """Each CPU's clock now (/proc/cpuinfo; fixed on hosts that do not report it)."""
    out: dict[int, float] = {}
    cpu = -1
    try:
        lines = (PROC / "cpuinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "processor":
            cpu = int(value)
        elif key.strip() == "cpu MHz":
            out[cpu] = float(value)
    return out


def busiest(
    before: dict[tuple[int, int], ThreadRow],
    after: dict[tuple[int, int], ThreadRow],
    seconds: float,
    top: int,
    mhz: dict[int, float] | None = None,
    steal: tuple[dict[int, int], dict[int, int]] | None = None,
) -> list[str]:
    """The `top` threads by CPU between two snapshots, one line each: CPU %, run-queue wait %
    (runnable but not running: preempted or not yet placed), last CPU, its MHz and its steal %
    over the interval (`steal`: cpu_steal() before and after), switches."""
    rows = []
    for key, a in after.items():
        if (b := before.get(key)) is not None:
            pct = 100 * (a.cpu_s - b.cpu_s) / seconds
            rows.append((pct, 100 * (a.wait_s - b.wait_s) / seconds, key, a, b))
    rows.sort(key=lambda r: r[0], reverse=True)
    mhz = mhz or {}
    s0, s1 = steal or ({}, {})

    def stolen(cpu: int) -> float:
        return 100 * (s1.get(cpu, 0) - s0.get(cpu, 0)) / TICK / seconds

    return [
        f"  {pid:>7} {tid:>7} {pct:5.1f}% wait {wait:4.1f}% cpu{a.psr:<3}"
        f" {mhz.get(a.psr, 0):5.0f}MHz steal {stolen(a.psr):4.1f}%"
        f" vcs {a.voluntary - b.voluntary:>5}"
        f" ics {a.involuntary - b.involuntary:>4} {a.name}"
        for pct, wait, (pid, tid), a, b in rows[:top]
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nanoserve.benchmarks.thread_sample",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    p.add_argument("--top", type=int, default=12, help="threads listed a sample")
    p.add_argument("--prefix", default="python", help="processes whose command starts so")
    p.add_argument("--samples", type=int, default=0, help="stop after this many (0: never)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    before, t0, n = snapshot(args.prefix), time.monotonic(), 0
    steal0 = cpu_steal()
    while args.samples == 0 or n < args.samples:
        time.sleep(args.interval)
        after, t1, steal1 = snapshot(args.prefix), time.monotonic(), cpu_steal()
        stamp = (
            time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        )
        lines = busiest(before, after, t1 - t0, args.top, cpu_mhz(), (steal0, steal1))
        print(stamp, *lines, sep="\n", flush=True)
        before, t0, steal0, n = after, t1, steal1, n + 1


if __name__ == "__main__":
    main()
