"""What a service process tree spends while a `bench serving` run goes on, read from Linux /proc:
CPU seconds, write and read syscalls (each gRPC flush is a sendmsg), context switches; and an
optional py-spy profile of each service over the run (`--profile-dir`), summarized by its top frames.
"""

import collections
import os
import shutil
import signal
import subprocess
from pathlib import Path

PROC = Path("/proc")
FIELDS = ("cpu_s", "syscw", "syscr", "ctxsw")


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    parent = {}
    for d in PROC.iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:  # exited meanwhile
                continue
    tree, frontier = [pid], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree += kids
        frontier += kids
    return tree


def one_process(pid: int) -> dict[str, float]:
    """FIELDS of one process (no descendants): CPU seconds, syscalls, context switches."""
    d = PROC / str(pid)
    stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
    out = {"cpu_s": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")}
    try:  # /proc/PID/io needs the same user (or root)
        io = dict(line.split(": ") for line in (d / "io").read_text().splitlines())
        out.update(syscw=int(io["syscw"]), syscr=int(io["syscr"]))
    except (OSError, KeyError, ValueError):
        pass
    status = dict(
        line.split(":\t", 1) for line in (d / "status").read_text().splitlines() if ":\t" in line
    )
    out["ctxsw"] = int(status.get("voluntary_ctxt_switches", 0)) + int(
        status.get("nonvoluntary_ctxt_switches", 0)
    )
    return out


def tree_counters(pid: int) -> dict[str, float]:
    """Sum of FIELDS over `pid`'s process tree (zeros off Linux)."""
    total = dict.fromkeys(FIELDS, 0.0)
    if not PROC.is_dir():
        return total
    for p in process_tree(pid):
        try:
            for k, v in one_process(p).items():
                total[k] += v
        except OSError:  # exited meanwhile
            continue
    return total


def per_token(before: dict, after: dict, wall_s: float, tokens: int) -> dict[str, float]:
    """The run's spend: CPU cores, and per output token CPU µs and syscalls."""
    d = {k: after[k] - before[k] for k in FIELDS}
    t = max(tokens, 1)
    return dict(
        cores=round(d["cpu_s"] / wall_s, 2),
        cpu_us_per_token=round(d["cpu_s"] / t * 1e6, 1),
        writes_per_token=round(d["syscw"] / t, 3),
        reads_per_token=round(d["syscr"] / t, 3),
        ctxsw_per_token=round(d["ctxsw"] / t, 3),
    )


class Profiler:
    """py-spy (when on PATH) records each service's main process with native frames while a run
    goes on; `stop` returns each one's top self frames (share of samples)."""

    def __init__(self, out_dir: str, pids: dict[str, int], tag: str) -> None:
        self.files: dict[str, Path] = {}
        self.procs: list[subprocess.Popen] = []
        spy = shutil.which("py-spy")
        if not out_dir or spy is None:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            f = self.files[name] = Path(out_dir) / f"{tag}-{name}.txt"
            # --native (C frames: grpc core, syscalls) stops the process at each sample: 100 Hz keeps
            # that well under 1% of its time
            cmd = [spy, "record", "-p", str(pid), "-r", "100", "--native", "-f", "raw"]
            self.procs.append(
                subprocess.Popen(
                    [*cmd, "-o", str(f)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self, top: int = 12) -> dict[str, list]:
        for p in self.procs:
            p.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        return {name: top_frames(f, top) for name, f in self.files.items() if f.exists()}


def top_frames(path: Path, top: int) -> list:
    """[(frame, share of samples it is the innermost of)], most first, from py-spy's raw output."""
    own: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        own[stack.rsplit(";", 1)[-1].split(" (")[0][:60]] += int(n)
    return [(f, round(n / max(total, 1), 3)) for f, n in own.most_common(top)]
