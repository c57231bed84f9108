"""`python -m nanoserve.benchmarks.thread_sample`: every --interval seconds, the busiest threads of
the machine's Python processes over that interval, from Linux /proc: CPU %, the CPU each last ran
on, context switches (voluntary: it slept; involuntary: it was preempted) and its thread name
(ours are named: core-outbox, core-inbox, core-heartbeat, tokenizer_0 ...). For the one-stream
probes of issue 29 (gpu_run.sh onestream): where a slow probe's host time went. Runs until killed.
"""

import argparse
import os
import time
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")


def _read_thread(task: Path) -> tuple[float, int, int, int, str] | None:
    """(cpu seconds, last CPU, voluntary, involuntary switches, name) of one thread."""
    try:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        status = (task / "status").read_text().splitlines()
        name = (task / "comm").read_text().strip()
    except OSError:  # exited meanwhile
        return None
    # after the ")": state is field 3 of stat, utime 14, stime 15, processor 39 (1-based)
    cpu_s = (int(fields[11]) + int(fields[12])) / TICK
    switches = {
        k: int(v) for k, v in (line.split(":\t") for line in status if "ctxt_switches" in line)
    }
    return (
        cpu_s,
        int(fields[36]),
        switches.get("voluntary_ctxt_switches", 0),
        switches.get("nonvoluntary_ctxt_switches", 0),
        name,
    )


def snapshot(prefix: str) -> dict[tuple[int, int], tuple[float, int, int, int, str]]:
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
            if (row := _read_thread(task)) is not None:
                out[(int(proc.name), int(task.name))] = row
    return out


def busiest(before: dict, after: dict, seconds: float, top: int) -> list[str]:
    """The `top` threads by CPU between two snapshots, one line each."""
    rows = []
    for key, (cpu, psr, vol, invol, name) in after.items():
        if key in before:
            b = before[key]
            rows.append((100 * (cpu - b[0]) / seconds, key, psr, vol - b[2], invol - b[3], name))
    rows.sort(reverse=True)
    return [
        f"  {pid:>7} {tid:>7} {pct:5.1f}% cpu{psr:<3} vcs {v:>5} ics {i:>4} {name}"
        for pct, (pid, tid), psr, v, i, name in rows[:top]
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
    while args.samples == 0 or n < args.samples:
        time.sleep(args.interval)
        after, t1 = snapshot(args.prefix), time.monotonic()
        stamp = (
            time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        )
        print(stamp, *busiest(before, after, t1 - t0, args.top), sep="\n", flush=True)
        before, t0, n = after, t1, n + 1


if __name__ == "__main__":
    main()
