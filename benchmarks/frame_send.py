"""`nanoserve bench frame-send`: what sending its Step frame costs the engine core's step loop
(worker.core.frame_io). A loop of small torch ops (~0.4 ms of host work, like a batch-1 step)
sends one frame a step to a reader process: a plain pipe write, FrameWriter as it runs (direct into
an empty pipe) and FrameWriter through its thread (a GIL handoff and a wake-up each frame).
Prints one JSON line per case and round: the median and mean µs of a step; figures, not pass/fail.
"""

import argparse
import json
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection

import torch

from nanoserve.worker.core.frame_io import FrameWriter

CASES = ("plain", "direct", "thread")


def _read(inbox: Connection, out: Connection) -> None:
    out.close()  # the forked copy of the write end: the parent's close must reach EOF
    try:
        while True:
            inbox.recv_bytes()
    except EOFError:
        pass


def run(case: str, steps: int, ops: int, frame_bytes: int) -> dict:
    inbox, out = mp.Pipe(duplex=False)
    reader = mp.Process(target=_read, args=(inbox, out), daemon=True)
    reader.start()
    inbox.close()
    writer = None if case == "plain" else FrameWriter(out, "bench-out")
    if writer is not None and case == "thread":
        writer.direct_max = 0  # every frame through the thread, as before the direct write
    send = out.send_bytes if writer is None else writer.send_bytes
    x, frame, times = torch.ones(16), b"x" * frame_bytes, []
    for _ in range(steps):
        started = time.perf_counter()
        for _ in range(ops):  # a step's host work: many small ops, each releasing the GIL
            x = x + 1.0
        send(frame)
        times.append(time.perf_counter() - started)
    if writer is not None:
        writer.flush(10.0)
        writer.close()
        writer.thread.join(10)
    out.close()
    reader.join(10)
    return dict(
        bench="frame_send",
        case=case,
        step_us_median=round(statistics.median(times) * 1e6, 1),
        step_us_mean=round(statistics.mean(times) * 1e6, 1),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nanoserve bench frame-send",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=400, help="steps a case and round")
    p.add_argument("--ops", type=int, default=150, help="small torch ops a step")
    p.add_argument("--frame-bytes", type=int, default=200, help="a step frame's size")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the cases, interleaved")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    for _ in range(args.rounds):
        for case in CASES:
            print(json.dumps(run(case, args.steps, args.ops, args.frame_bytes)), flush=True)


if __name__ == "__main__":
    main()
