"""The two pipes between the worker's gRPC process and its engine core, each end served by a thread.

A pipe holds 64 KiB: a process that writes a larger frame while the other end writes one too, and
reads only between its own writes, blocks both forever (issue 32). So no loop ever makes a write
that can block: FrameWriter writes a frame itself only into an empty pipe with room to spare, and
otherwise its thread does, from a queue; the core's FrameReader thread drains its inbox whatever the
step loop is doing; the gRPC process reads on its event loop, which never blocks.
"""

import array
import ctypes
import fcntl
import logging
import os
import queue
import stat
import termios
import threading
import time
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)


PR_SET_NAME = 15  # Linux prctl: the calling thread's name, as /proc and top show it


def name_os_thread() -> None:
    """Gives the calling OS thread its Python thread's name (15 bytes at most), so that per-thread
    samples (/proc, top -H, benchmarks.thread_sample) tell the pipe threads apart; Python names
    only its own object before 3.14. Nothing where libc or prctl is not there."""
    try:
        # the process's own symbols, libc's among them: find_library would run ldconfig, a fork
        # from a thread of a CUDA process at every thread start
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, threading.current_thread().name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


F_GETPIPE_SZ = 1032  # Linux's fcntl for a pipe's capacity (Python names it from 3.10, on Linux)


def pipe_capacity(conn: Connection) -> int:
    """The capacity of the pipe `conn` writes (64 KiB by default); 0 where it is not a Linux pipe
    (then every frame goes through the thread)."""
    try:
        fd = conn.fileno()
        return fcntl.fcntl(fd, F_GETPIPE_SZ) if stat.S_ISFIFO(os.fstat(fd).st_mode) else 0
    except OSError:
        return 0


def pipe_unread(conn: Connection) -> int:
    """Bytes written to `conn`'s pipe and not yet read (FIONREAD answers on either end)."""
    count = array.array("i", [0])
    fcntl.ioctl(conn.fileno(), termios.FIONREAD, count)
    return count[0]


class FrameWriter:
    """`send_bytes` writes a frame at once where that cannot block: nothing queued before it and an
    empty pipe with room for it (a step's frame, as the reader keeps up). Else it queues the frame and
    returns, and a thread writes the queue to `conn` in order. The direct write spares the sending
    loop a thread handoff a frame (the GIL and a wake-up: ~30 µs on a 2-core CI box, per engine
    step in the core)."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        # frames up to half the pipe go direct: a frame of n bytes takes at most n / 4096 + 2 of
        # the empty pipe's 4 KiB pages (its 4-byte header may be a write of its own)
        self.direct_max = pipe_capacity(conn) // 2
        self.frames: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.pending = 0  # frames queued and not yet written (flush waits for 0)
        self.lock = threading.Lock()
        self.broken: OSError | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def send_bytes(self, data: bytes) -> None:
        if self.broken is not None:
            raise self.broken  # the other end is gone: as a plain pipe write would
        with self.lock:  # held by the thread only to count: pending == 0 means it is not writing
            if self.pending == 0 and len(data) <= self.direct_max:
                try:
                    if pipe_unread(self.conn) == 0:
                        self.conn.send_bytes(data)  # cannot block: only the reader changes it
                        return
                except OSError as e:  # the reader died: as the thread does, the next send raises
                    self.broken = e
                    return
            self.pending += 1
        self.frames.put(data)

    def _run(self) -> None:
        name_os_thread()
        while (data := self.frames.get()) is not None:
            try:
                if self.broken is None:
                    self.conn.send_bytes(data)
            except OSError as e:  # the reader died: its EOF tells the rest
                self.broken = e
                logger.debug("frame writer %s: %s", self.thread.name, e)
            with self.lock:
                self.pending -= 1

    def flush(self, timeout_s: float) -> bool:
        """Waits up to timeout_s for every queued frame to be written; whether they were."""
        deadline = time.monotonic() + timeout_s
        while self.pending and self.broken is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.pending

    def close(self) -> None:
        self.frames.put(None)


class FrameReader:
    """A thread that reads frames from `conn` into `frames` as they come; None once it closed."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.frames: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        name_os_thread()
        try:
            while True:
                self.frames.put(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.frames.put(None)

    def get(self, timeout_s: float | None) -> bytes | None:
        """The next frame, waiting up to timeout_s (None: forever, 0: not at all); raises
        queue.Empty when none came."""
        if timeout_s == 0:
            return self.frames.get_nowait()
        return self.frames.get(timeout=timeout_s)
