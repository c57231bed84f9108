"""`python -m nanoserve.benchmarks.step_mailbox`: what the tensor-parallel step mailbox
(worker.tp.mailbox) costs on the host: rank 0's publish() call, and the latency from the
start of publish() to the end of a rank's read(), with ranks busy (spinning: steps come faster than
SPIN_S) and idle (asleep on the wake-up pipe). Prints one JSON line per case; figures, not pass/fail.
"""

import argparse
import json
import multiprocessing as mp
import time

import numpy as np

from nanoserve.worker.runner.step_inputs import max_message_words
from nanoserve.worker.tp.mailbox import StepMailbox


def _reader(handle, steps: int, results) -> None:
    box = StepMailbox.attach(*handle)
    latencies = np.empty(steps, dtype=np.int64)
    for i in range(steps):
        msg = box.read()
        latencies[i] = time.perf_counter_ns() - msg[0]  # CLOCK_MONOTONIC: one clock for all
    box.close()
    results.put(latencies)


def run_case(readers: int, words: int, steps: int, interval_us: float, max_words: int) -> dict:
    ctx = mp.get_context("spawn")
    box = StepMailbox(readers, max_words, ctx)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_reader, args=(box.handle(r), steps, results), daemon=True)
        for r in range(readers)
    ]
    for p in procs:
        p.start()
    msg = np.arange(words, dtype=np.int64)
    publish_ns = np.empty(steps, dtype=np.int64)
    time.sleep(2.0)  # the readers are up and asleep
    for i in range(steps):
        due = time.perf_counter() + interval_us * 1e-6
        start = time.perf_counter_ns()
        msg[0] = start
        box.publish(msg)
        publish_ns[i] = time.perf_counter_ns() - start
        time.sleep(max(0.0, due - time.perf_counter() - 2e-4))  # leave the cores to the readers
        while time.perf_counter() < due:
            pass
    latencies = np.concatenate([results.get(timeout=120)[steps // 10 :] for _ in procs])
    for p in procs:
        p.join(10)
    box.close(unlink=True)
    us = lambda a, q: round(float(np.percentile(a, q)) / 1000, 1)
    return {
        "readers": readers,
        "words": words,
        "interval_us": interval_us,
        "publish_us_p50": us(publish_ns[steps // 10 :], 50),
        "publish_us_p99": us(publish_ns[steps // 10 :], 99),
        "read_latency_us_p50": us(latencies, 50),
        "read_latency_us_p99": us(latencies, 99),
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nanoserve bench step-mailbox", description=__doc__)
    ap.add_argument(
        "--readers",
        type=int,
        nargs="+",
        default=[1, 3],
        help="rank processes reading each step, one run per count (default: 1 3)",
    )
    ap.add_argument(
        "--steps", type=int, default=2000, help="steps published per run (default: 2000)"
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    max_words = max_message_words(16384, 256, 256)
    # a batch-1 decode step and a 256-sequence decode step with 64-block tables
    sizes = [max_message_words(1, 1, 1), max_message_words(256, 256, 64)]
    for readers in args.readers:
        for words in sizes:
            for interval_us in (1000.0, 20000.0):  # busy (readers spin), idle (readers sleep)
                steps = args.steps if interval_us < 5000 else args.steps // 10
                print(
                    json.dumps(run_case(readers, words, steps, interval_us, max_words)), flush=True
                )


if __name__ == "__main__":
    main()
