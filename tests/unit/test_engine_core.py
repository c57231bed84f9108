"""EngineCore in-process over real pipes: core.frames in and out, one Step frame per engine step
carrying every request, adds and aborts applied between steps (an abort frees the blocks), a
refused add named, the exit frame ends the loop."""

import threading
from multiprocessing import Pipe
from typing import NamedTuple

import pytest

from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.core import engine_core
from nanoserve.worker.core.frames import (
    Add,
    Finish,
    LoadFrame,
    Refused,
    Step,
    decode,
    encode,
    inbox_frame,
    read_inbox,
)
from nanoserve.worker.core.stats_log import Load
from tests.unit.hf_reference import make_hf_model

NUM_BLOCKS = 32


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("engine_core_model")
    make_hf_model(tmp_path)
    config = WorkerConfig(
        model=str(tmp_path),
        device="cpu",
        kvcache_block_size=16,
        num_kvcache_blocks=NUM_BLOCKS,
        max_model_len=512,
    )
    core_in, to_core = Pipe(duplex=False)
    from_core, core_out = Pipe(duplex=False)
    core = engine_core.EngineCore(config, core_in, core_out)
    thread = threading.Thread(target=core.run, daemon=True)
    thread.start()
    yield to_core, from_core, core
    to_core.send_bytes(inbox_frame([], [], exit_=True))
    thread.join(timeout=30)
    assert not thread.is_alive()
    core.engine.shutdown()


def add(engine_id: int, token_ids: list[int], sp: dict) -> Add:
    return Add(engine_id, token_ids, sp, None, 0, None)


def params(**kw) -> dict:
    sp = {"temperature": 0.0, "max_tokens": 4, "stop_token_ids": []}
    return sp | kw


def read_until(from_core, done) -> list:
    frames = []
    while not frames or not done(frames):
        assert from_core.poll(30), "the engine core sent nothing for 30 s"
        frames.append(decode(from_core.recv_bytes()))
    return frames


class Out(NamedTuple):
    """A frames.Output by name (the core sends them as plain arrays)."""

    engine_id: int
    new_ids: list[int]
    finish: list | None
    completion: int
    logprobs: list | None
    prompt_logprobs: list | None


def outputs(frames: list) -> list[Out]:
    """Every Step frame's outputs, in order."""
    return [Out._make(out) for f in frames if isinstance(f, Step) for out in f.outputs]


def finishes(frames: list) -> list[tuple[Out, Finish]]:
    return [(out, Finish._make(out.finish)) for out in outputs(frames) if out.finish is not None]


def idle(frames: list) -> bool:
    """The latest load report (LoadFrame and Step frames carry one) shows nothing running or
    waiting and every block free."""
    frame = frames[-1]
    if not isinstance(frame, LoadFrame | Step):
        return False
    load = Load._make(frame.load)
    return (load.num_running, load.num_waiting, load.num_free_blocks) == (0, 0, NUM_BLOCKS)


def test_one_frame_per_step_carries_every_request(core) -> None:
    to_core, from_core, _ = core
    adds = [add(i, [5 + i, 6, 7], params()) for i in range(3)]
    to_core.send_bytes(inbox_frame(adds, []))
    finished: set[int] = set()

    def done(frames: list) -> bool:
        finished.update(out.engine_id for out, _ in finishes(frames[-1:]))
        return finished == {0, 1, 2}

    frames = read_until(from_core, done)
    ids = {
        i: [t for out in outputs(frames) if out.engine_id == i for t in out.new_ids]
        for i in range(3)
    }
    assert all(len(v) == 4 for v in ids.values()), ids
    assert max(len(f.outputs) for f in frames if isinstance(f, Step)) == 3  # one step, all three
    last = {out.engine_id: fin for out, fin in finishes(frames)}
    assert all(
        (fin.reason, fin.prompt_tokens, fin.completion_tokens) == ("length", 3, 4)
        for fin in last.values()
    ), last
    assert idle(frames)  # the last step's frame reports every block free


def test_abort_frees_blocks_and_a_duplicate_add_is_refused(core) -> None:
    to_core, from_core, _ = core
    to_core.send_bytes(
        inbox_frame([add(7, [1, 2, 3], params(max_tokens=400)), add(7, [4], params())], [])
    )
    frames = read_until(from_core, lambda fs: any(isinstance(f, Step) for f in fs))
    refused = [f for f in frames if isinstance(f, Refused)]
    # the core trusts its frames (the server checked them): only a bug, an engine id already
    # running, is refused, and only that add
    assert refused and refused[0].engine_id == 7 and "already running" in refused[0].reason
    to_core.send_bytes(inbox_frame([], [7]))
    frames = read_until(from_core, idle)
    assert isinstance(frames[-1], LoadFrame)  # sent on going idle: GetLoad sees the blocks back


def test_an_add_and_its_abort_in_one_frame_leave_nothing_running(core) -> None:
    to_core, from_core, c = core
    to_core.send_bytes(inbox_frame([add(3, [1, 2], params(max_tokens=400))], [3]))
    frames = read_until(from_core, idle)
    assert [type(f) for f in frames] == [LoadFrame]  # never stepped
    assert c.engine.requests == {}


def test_a_completion_abort_ends_that_completion_only(core) -> None:
    """[engine id, index] in an add frame's completion aborts: that completion stops (no finish
    frame for it), the request's others run to max_tokens, then every block is free."""
    to_core, from_core, _ = core
    sp = params(temperature=1.0, seed=5, max_tokens=200, ignore_eos=True, n=3)
    to_core.send_bytes(inbox_frame([add(11, [1, 2, 3], sp)], []))
    read_until(from_core, lambda fs: sum(isinstance(f, Step) for f in fs) >= 3)
    to_core.send_bytes(inbox_frame([], [], completion_aborts=[[11, 1], [99, 0]]))
    frames = read_until(from_core, idle)
    finished = {out.completion: fin for out, fin in finishes(frames)}
    assert set(finished) == {0, 2} and all(
        (fin.reason, fin.prompt_tokens, fin.completion_tokens) == ("length", 3, 200)
        for fin in finished.values()
    )


def test_sampling_fields_cross_the_pipe_with_unset_kept():
    """An add frame carries SamplingParams (its `unset` frozenset cannot be packed): the core's
    rebuilt copy equals the server's and still knows which fields the request left unset."""
    from nanoserve.sampling import SamplingParams

    sp = SamplingParams(temperature=None, top_k=5, max_tokens=7, stop_token_ids=(3, 4))
    frame = inbox_frame([add(0, [1, 2], sp.as_fields())], [], exit_=False)
    rebuilt = SamplingParams.trusted(Add._make(read_inbox(frame).adds[0]).params)
    assert rebuilt == sp
    assert rebuilt.unset == sp.unset and "temperature" in rebuilt.unset


def test_the_load_report_fits_both_of_its_readers(core) -> None:
    """EngineCore.load() crosses the pipe as a list; the stats line (Load) and the metrics
    (WorkerLoad) both unpack it: a field added on one side only killed the engine at its first
    step on the GPU run."""
    from nanoserve.worker.service.metrics import WorkerLoad

    _, _, c = core
    report = c.load()
    crossed = Load._make(decode(encode(LoadFrame(report))).load)  # as a reader gets it
    assert crossed == report and crossed.num_total_blocks == NUM_BLOCKS
    assert WorkerLoad.from_load(crossed, 0).num_total_blocks == NUM_BLOCKS


def test_an_add_that_cannot_be_framed_ends_its_stream_instead_of_hanging() -> None:
    """A value msgpack cannot pack (a bug) refuses that request; nothing waits forever."""
    import asyncio

    from nanoserve.worker.service.async_engine import AsyncEngine

    class Sink:
        def __init__(self) -> None:
            self.frames: list[bytes] = []

        def send_bytes(self, data: bytes) -> None:
            self.frames.append(data)

    async def main() -> None:
        engine = AsyncEngine.__new__(AsyncEngine)  # only the flush path: no engine process
        engine.adds, engine.aborts, engine.flush_scheduled, engine.error = [], [7], True, None
        engine.completion_aborts = []
        engine.streams, engine.by_request_id, engine.to_core = {}, {}, Sink()
        ended = []
        engine._on_refused = lambda frame: ended.append((frame.engine_id, frame.reason))
        engine.adds.append([3, [1, 2], {"temperature": frozenset()}])
        engine._flush()
        assert ended and ended[0][0] == 3 and "could not be sent" in ended[0][1]
        assert read_inbox(engine.to_core.frames[0]) == ([], [7], False, [])  # the aborts go

    asyncio.run(main())
