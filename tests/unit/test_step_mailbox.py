"""The tensor-parallel step mailbox (worker.tp.mailbox): every reader gets every step, in
order and whole, also when a reader is stopped (SIGSTOP, as cgroup CPU throttling does) while rank 0
publishes many steps into a small ring; an overrun ring or a dead peer raises instead of hanging."""

import multiprocessing as mp
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from nanoserve.worker.tp.mailbox import PeerDied, StepMailbox

STEPS = 400


def message(step: int) -> np.ndarray:
    """Lengths vary from step to step; every word tells the step, so a torn copy shows."""
    return np.full(1 + (step * 37) % 300, step, dtype=np.int64)


def reader_main(handle, results) -> None:
    """A rank's loop: read until the exit message (a single -1), checking every step."""
    box = StepMailbox.attach(*handle)
    got, torn = [], []
    while True:
        msg = box.read()
        if len(msg) == 1 and msg[0] == -1:
            break
        step = int(msg[0])
        got.append(step)
        if len(msg) != len(message(step)) or not (msg == step).all():
            torn.append(step)
    box.close()
    results.put((handle[3], got, torn))


def test_a_stalled_reader_reads_every_step_in_order_and_whole():
    ctx = mp.get_context("spawn")
    box = StepMailbox(
        2, 512, ctx, slots=2
    )  # two slots: rank 0 is soon held back by the stalled rank
    results = ctx.Queue()
    procs = [
        ctx.Process(target=reader_main, args=(box.handle(r), results), daemon=True)
        for r in range(2)
    ]
    for p in procs:
        p.start()

    def alive():
        if any(not p.is_alive() for p in procs):
            raise PeerDied("a reader died")

    stop = threading.Event()

    def stall():  # SIGSTOP one reader for 0-20 ms, again and again, while rank 0 publishes
        rng = random.Random(0)
        while not stop.wait(rng.uniform(0, 0.01)):
            os.kill(procs[0].pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0, 0.02))
            os.kill(procs[0].pid, signal.SIGCONT)

    staller = threading.Thread(target=stall)
    staller.start()
    try:
        for step in range(1, STEPS + 1):
            box.publish(message(step), alive)
        stop.set()
        staller.join()
        box.publish(np.array([-1]), alive)
        out = sorted(results.get(timeout=60) for _ in procs)
    finally:
        stop.set()
        staller.join()
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
            p.join(10)
        box.close(unlink=True)
    for reader, got, torn in out:
        assert got == list(range(1, STEPS + 1)), reader
        assert torn == [], reader


def test_one_process_round_trip_and_overrun_detection():
    """Reader and writer in one process: steps come back in order; a reader whose slot holds a
    newer step (an overrun, which the acknowledgements exclude) raises instead of running it."""
    box = StepMailbox(1, 512, mp.get_context("spawn"), slots=2)
    reader = StepMailbox.attach(*box.handle(0))
    try:
        for step in (1, 2, 3):
            box.publish(message(step))
            assert (reader.read() == message(step)).all()
        box.acks[0] = 100  # a reader that lied about what it read lets rank 0 lap it
        box.publish(message(4))
        box.publish(message(5))
        box.publish(message(6))  # overwrites slot 1, where step 4 was due
        with pytest.raises(RuntimeError, match="overrun"):
            reader.read()
    finally:
        reader.close()
        box.close(unlink=True)


def test_publish_to_a_reader_that_never_reads_ends_when_it_is_found_dead():
    box = StepMailbox(1, 512, mp.get_context("spawn"), slots=2)
    calls = []

    def alive():
        calls.append(time.monotonic())
        if len(calls) >= 2:
            raise PeerDied("rank 1 died")

    try:
        box.publish(message(1), alive)
        box.publish(message(2), alive)  # the ring is full now
        start = time.monotonic()
        with pytest.raises(PeerDied):
            box.publish(message(3), alive)
        assert time.monotonic() - start < 5.0
    finally:
        box.close(unlink=True)
