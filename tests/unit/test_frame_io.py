"""worker.core.frame_io: the gRPC process and the engine core each write their pipe from a thread, so two
frames larger than the pipe (64 KiB) written at once in both directions cannot block each other
(issue 32: the deadlock a big add frame met a big step frame in). A frame-size sweep, bounded in time.
A small frame into an empty pipe is written at once, without the thread, and frames stay in order.
"""

import multiprocessing as mp
import threading

import pytest

from nanoserve.worker.core.frame_io import FrameReader, FrameWriter

SIZES = [1, 1024, 65_536, 65_537, 300_000, 1 << 20, 4 << 20]


def _side(out, inbox, name: str, frames: list[bytes], got: list[bytes]) -> None:
    """Writes all its frames (as one step loop would: without reading between them), then reads
    the other side's; the old blocking send_bytes here deadlocks past 64 KiB each way."""
    writer = FrameWriter(out, f"{name}-out")
    reader = FrameReader(inbox, f"{name}-in")
    for frame in frames:
        writer.send_bytes(frame)
    for _ in frames:
        data = reader.get(30.0)
        assert data is not None
        got.append(data)
    assert writer.flush(30.0)


@pytest.mark.parametrize("size", SIZES)
def test_frames_past_the_pipe_in_both_directions_at_once(size: int) -> None:
    a_in, b_out = mp.Pipe(duplex=False)
    b_in, a_out = mp.Pipe(duplex=False)
    a_frames = [bytes([i]) * size for i in range(3)]
    b_frames = [bytes([100 + i]) * size for i in range(3)]
    a_got: list[bytes] = []
    b_got: list[bytes] = []
    threads = [
        threading.Thread(target=_side, args=(a_out, a_in, "a", a_frames, a_got), daemon=True),
        threading.Thread(target=_side, args=(b_out, b_in, "b", b_frames, b_got), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), f"frames of {size} bytes blocked both sides"
    assert a_got == b_frames and b_got == a_frames  # whole, in order


def test_a_closed_reader_end_reads_as_none_and_a_dead_peer_fails_the_next_send() -> None:
    inbox, out = mp.Pipe(duplex=False)
    reader = FrameReader(inbox, "r")
    writer = FrameWriter(out, "w")
    writer.send_bytes(b"x")
    assert reader.get(10.0) == b"x"
    writer.close()
    writer.thread.join(10)
    out.close()
    assert reader.get(10.0) is None  # EOF
    inbox2, out2 = mp.Pipe(duplex=False)
    inbox2.close()
    w2 = FrameWriter(out2, "w2")
    w2.send_bytes(b"lost")
    w2.flush(10.0)
    with pytest.raises(OSError):
        w2.send_bytes(b"more")


def test_a_small_frame_into_an_empty_pipe_is_written_at_once() -> None:
    inbox, out = mp.Pipe(duplex=False)
    writer = FrameWriter(out, "w")
    assert writer.direct_max == 32 * 1024  # half of Linux's default pipe
    writer.send_bytes(b"step")
    assert inbox.poll(0)  # already in the pipe when send_bytes returned: no thread involved
    assert inbox.recv_bytes() == b"step"
    assert writer.pending == 0


def test_frames_keep_their_order_whichever_way_each_goes() -> None:
    """A frame too big to go direct queues; the small ones after it queue behind it, and so does
    one sent while the pipe holds unread bytes; once all is read, small frames go direct again."""
    inbox, out = mp.Pipe(duplex=False)
    writer = FrameWriter(out, "w")
    reader = FrameReader(inbox, "r")
    frames = [b"a", b"B" * 200_000, b"c", b"d", b"e" * 100, b"f"]
    for frame in frames:
        writer.send_bytes(frame)
    assert [reader.get(10.0) for _ in frames] == frames
    assert writer.flush(10.0)
    writer.send_bytes(b"x")
    writer.send_bytes(b"y")  # "x" may still be unread: queued or direct, the order holds
    assert [reader.get(10.0), reader.get(10.0)] == [b"x", b"y"]


def test_a_frame_into_a_pipe_holding_unread_bytes_goes_through_the_thread() -> None:
    inbox, out = mp.Pipe(duplex=False)
    writers: list[tuple[bytes, str]] = []  # (frame, the thread that wrote it)
    write = out.send_bytes
    out.send_bytes = lambda data: (
        writers.append((data, threading.current_thread().name)),
        write(data),
    )  # type: ignore[method-assign]
    writer = FrameWriter(out, "writer-thread")
    writer.send_bytes(b"first")  # the pipe was empty: written here
    writer.send_bytes(b"second")  # "first" is unread: the thread writes it
    assert writer.flush(10.0)
    me = threading.current_thread().name
    assert writers == [(b"first", me), (b"second", "writer-thread")]
    assert inbox.recv_bytes() == b"first" and inbox.recv_bytes() == b"second"
