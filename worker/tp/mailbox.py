"""The tensor-parallel step mailbox: rank 0 publishes every step's encoded StepInputs into a ring of
shared-memory slots and each other rank reads every one of them, in order (worker.tp.runner).

Layout (int64 words of one SharedMemory): one 64-byte control line per reader (its "read up to"
step count and its "asleep" flag), then SLOTS slots of [step number | length | message]. Step i
(1, 2, ...) goes into slot (i - 1) % SLOTS. Rank 0 writes slot i only once every reader has
acknowledged step i - SLOTS, the slot's previous tenant, so a reader never misses or tears a step;
a reader that finds a newer step number in its slot (which the protocol excludes) raises.

Memory ordering. Step numbers and acknowledgements are aligned 8-byte words, which x86-64 and
aarch64 load and store whole; but the plain loads and stores of numpy carry no ordering, and on
aarch64 (Grace) nothing else orders the message's words against the step number. The order comes
from one process-shared lock (a POSIX semaphore, whose sem_wait/sem_post are acquire/release),
taken as a synchronisation point with at most one store inside ("[...]" below):
  publish:  write message ; [store step number] ; load the readers' "asleep" flags
  read:     load step number == i (a hint) ; [] ; copy message ; [check step number ; store ack]
  reuse:    load every acknowledgement >= i - SLOTS (a hint) ; [] ; write message
  sleep:    store "asleep" ; [] ; load step number
Why a hint followed by a critical section is enough: the critical sections of all processes are
totally ordered by the lock. If a reader's load saw the step number, the writer's section that
stored it must precede the reader's next section (else the store would happen after the load that
read it), so the writer's message stores happen before the reader's copy. The same argument orders a
reader's copy before rank 0 overwrites the slot, and whichever of "asleep" and the step number is
stored in the earlier section is seen by the other side's load (no lost wake-up). A library of
portable atomics for Python (`atomics`) would give release/acquire stores and loads without the
lock, but it is not on the GPU hosts; the standard library's semaphore is (uncontended it is one
atomic instruction each way, no syscall).

A process killed inside a critical section would leave the lock held: every acquire is bounded
and checks, between attempts, that the other side still lives.
"""

import logging
import os
import select
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import numpy as np

logger = logging.getLogger(__name__)
SLOTS = 4  # how many steps rank 0 may run ahead of the slowest rank (at least 2)
MAX_BYTES = 32 << 20  # fewer slots when they are this big (containers' /dev/shm is often 64 MiB)
LINE = 8  # words per reader's control line (64 bytes: no false sharing between readers)
SLOT_HEADER = 2  # step number, length
SPIN_S = 0.005  # an idle reader polls this long (a busy engine publishes within ms), then sleeps
POLL_S = 0.5  # how often a blocked side checks that its peers still live
STALL_WARN_S = 60.0


class PeerDied(RuntimeError):
    """The other side of the mailbox is gone: nobody will publish or acknowledge again."""


class StepMailbox:
    """Rank 0 creates it (`StepMailbox(num_readers, max_words, ctx)`), passes `handle(reader)` to
    reader `reader` (0-based) when it spawns it, and calls `publish`; that reader calls
    `StepMailbox.attach(*handle)` and `read`."""

    # a reader's own: set by attach()
    reader: int  # its index, 0-based
    wake_r: Connection  # the read end of its wake-up pipe

    def __init__(self, num_readers: int, max_words: int, ctx, slots: int | None = None):
        self.stride = -(-(SLOT_HEADER + max_words) // LINE) * LINE
        if slots is None:  # the largest step message is far larger than a usual one
            slots = max(2, min(SLOTS, MAX_BYTES // (8 * self.stride)))
        self.num_readers, self.slots = num_readers, slots
        self.shm = SharedMemory(create=True, size=8 * (LINE * num_readers + slots * self.stride))
        self.lock = ctx.Lock()
        # wake-up pipes, rank 0 -> a sleeping reader: non-blocking, so a full pipe or a dead reader
        # never blocks publish (no shared Event whose lock a killed rank could hold)
        self.wake = [ctx.Pipe(duplex=False) for _ in range(num_readers)]
        for _, w in self.wake:
            os.set_blocking(w.fileno(), False)
        self._map()
        self.words[:] = 0
        self.step = 0  # rank 0: steps published; a reader: steps read
        self.acked = 0  # rank 0: every reader had read this many steps when last looked at

    def handle(self, reader: int) -> tuple:
        """What reader `reader` needs to attach (picklable for a spawned process)."""
        return (
            self.shm.name,
            self.lock,
            self.wake[reader][0],
            reader,
            self.num_readers,
            self.stride,
            self.slots,
        )

    @classmethod
    def attach(
        cls, shm_name: str, lock, wake, reader: int, num_readers: int, stride: int, slots: int
    ) -> "StepMailbox":
        self = cls.__new__(cls)
        self.shm, self.lock, self.wake_r, self.reader = (
            SharedMemory(name=shm_name),
            lock,
            wake,
            reader,
        )
        self.num_readers, self.stride, self.slots, self.step = num_readers, stride, slots, 0
        self._map()
        return self

    def _map(self) -> None:
        self.words = np.ndarray((self.shm.size // 8,), dtype=np.int64, buffer=self.shm.buf)
        base = LINE * self.num_readers
        self.acks = self.words[0:base:LINE]  # (readers,) steps read, one per control line
        self.asleep = self.words[1:base:LINE]
        self.slot_views = [
            self.words[base + k * self.stride : base + (k + 1) * self.stride]
            for k in range(self.slots)
        ]

    def _acquire(self, alive: Callable[[], None]) -> None:
        """Bounded by `alive`, which raises when the other side is gone."""
        if self.lock.acquire(False):  # the usual case: free
            return
        while not self.lock.acquire(timeout=POLL_S):
            alive()

    def _sync(self, alive: Callable[[], None]) -> None:
        """An empty critical section: the synchronisation point of the module docstring."""
        self._acquire(alive)
        self.lock.release()

    # ---- rank 0 ---------------------------------------------------------------------------------

    def publish(self, msg: np.ndarray, alive: Callable[[], None] = lambda: None) -> None:
        """Write step self.step + 1, once every reader has read the step that last used its slot.
        Waits (spin, then sleep with backoff) while a reader is SLOTS steps behind; `alive` raises
        when a reader is gone, so the wait ends."""
        i = self.step + 1
        slot = self.slot_views[(i - 1) % self.slots]
        if len(msg) > len(slot) - SLOT_HEADER:
            raise ValueError(
                f"step message of {len(msg)} words; the mailbox holds {len(slot) - SLOT_HEADER}"
            )
        if i > self.slots and self.acked < i - self.slots:
            # (an older sufficient observation was followed by a publish's section already)
            self._wait_acks(i - self.slots, alive)
            self._sync(alive)  # the readers' copies of that step before this overwrite
        slot[SLOT_HEADER : SLOT_HEADER + len(msg)] = msg
        slot[1] = len(msg)
        self._acquire(alive)
        slot[0] = i  # after the message, before the "asleep" loads
        self.lock.release()
        self.step = i
        for r in range(self.num_readers):
            if self.asleep[r]:
                try:
                    os.write(self.wake[r][1].fileno(), b"\1")
                except (BlockingIOError, BrokenPipeError):
                    pass  # a wake-up is already pending, or the reader is gone (alive() says so)

    def _wait_acks(self, step: int, alive: Callable[[], None]) -> None:
        self.acked = min(self.acks.tolist())
        start = last_check = warned = time.monotonic()
        pause = 0.0
        while self.acked < step:
            if pause:
                time.sleep(pause)
            else:
                os.sched_yield()
            now = time.monotonic()
            if now - start > 0.001:
                pause = min(max(pause * 2, 1e-5), 1e-3)
            if now - last_check > POLL_S:
                last_check = now
                alive()
                if now - warned > STALL_WARN_S:
                    warned = now
                    logger.warning(
                        "tensor-parallel ranks %s have not read step %d for %.0f s",
                        [r + 1 for r, a in enumerate(self.acks.tolist()) if a < step],
                        step,
                        now - start,
                    )
            self.acked = min(self.acks.tolist())

    # ---- ranks 1..N-1 -----------------------------------------------------------------------------

    def read(self, alive: Callable[[], None] = lambda: None) -> np.ndarray:
        """A copy of the next step's message. Spins SPIN_S, then sleeps on the wake-up pipe;
        `alive` (called at least every POLL_S while asleep) raises when rank 0 is gone."""
        i = self.step + 1
        slot = self.slot_views[(i - 1) % self.slots]
        if slot[0] != i:
            spin_until = time.perf_counter() + SPIN_S
            while slot[0] != i:
                if slot[0] > i:
                    raise RuntimeError(
                        f"step mailbox: step {int(slot[0])} found where step {i} "
                        "was due (the ring was overrun)"
                    )
                if time.perf_counter() > spin_until:
                    self._sleep(slot, i, alive)
                else:
                    os.sched_yield()  # an oversubscribed host runs its other threads meanwhile
        self._sync(alive)  # rank 0's message stores before this copy
        msg = slot[SLOT_HEADER : SLOT_HEADER + int(slot[1])].copy()
        self._acquire(alive)  # the copy before the acknowledgement
        overwritten = slot[0] != i  # excluded by the acknowledgements: a protocol bug
        self.acks[self.reader] = i
        self.lock.release()
        if overwritten:
            raise RuntimeError(f"step mailbox: step {i} was overwritten while it was read")
        self.step = i
        return msg

    def _sleep(self, slot: np.ndarray, i: int, alive: Callable[[], None]) -> None:
        self.asleep[self.reader] = 1
        self._sync(alive)  # "asleep" before the re-check of the step number (no lost wake-up)
        fd = self.wake_r.fileno()
        while slot[0] < i:
            ready, _, _ = select.select([fd], [], [], POLL_S)
            if ready:
                os.read(fd, 4096)  # drain the pending wake-ups
            else:
                alive()
        self.asleep[self.reader] = 0

    def close(self, unlink: bool = False) -> None:
        del self.acks, self.asleep, self.slot_views, self.words
        self.shm.close()
        if unlink:
            self.shm.unlink()
