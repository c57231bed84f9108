"""The two pipes between the worker's gRPC process and its engine core, each end served by a thread.

A pipe holds 64 KiB: a process that writes a larger frame while the other end writes one too, and
reads only between its own writes, blocks both forever (issue 32). So no loop ever writes a pipe
itself: FrameWriter's thread does, from a queue, and the core's FrameReader thread drains its inbox
whatever the step loop is doing; the gRPC process reads on its event loop, which never blocks.
"""

import logging
import queue
import threading
import time
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)


class FrameWriter:
    """`send_bytes` queues a frame and returns; a thread writes the frames to `conn` in order."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.frames: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.pending = 0  # frames queued and not yet written (flush waits for 0)
        self.lock = threading.Lock()
        self.broken: OSError | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def send_bytes(self, data: bytes) -> None:
        if self.broken is not None:
            raise self.broken  # the other end is gone: as a plain pipe write would
        with self.lock:
            self.pending += 1
        self.frames.put(data)

    def _run(self) -> None:
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
