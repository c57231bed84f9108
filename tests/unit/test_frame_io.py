"""worker.core.frame_io: the gRPC process and the engine core each write their pipe from a thread, so two
frames larger than the pipe (64 KiB) written at once in both directions cannot block each other
(issue 32: the deadlock a big add frame met a big step frame in). A frame-size sweep, bounded in time.
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
