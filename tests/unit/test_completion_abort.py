"""LLMEngine.abort_completion: one of an n > 1 request's completions ends early (its caller matched
a stop string); its own blocks are freed, the blocks it shares stay with the others, which finish
with the tokens they would have had, and the request ends when they have. Above it, the worker's
gRPC side (AsyncEngine, WorkerSession) counts the completion as ended and writes nothing more of
it."""

import asyncio
import collections

import pytest

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.core.frames import Step, read_inbox
from nanoserve.worker.sequence import FinishReason
from nanoserve.worker.service.async_engine import AsyncEngine
from nanoserve.worker.service.output_stream import Collector, Completion, Stream
from nanoserve.worker.service.session import WorkerSession
from tests.unit.hf_reference import make_hf_model
from tests.unit.test_engine_parity import assert_clean, prompts_of

SP = SamplingParams(temperature=0.8, seed=11, max_tokens=16, ignore_eos=True, n=4)


@pytest.fixture(scope="module", params=[False, True], ids=["eager", "lookahead"])
def llm(request, tmp_path_factory):
    """With decode lookahead too: a step forwarded ahead for the aborted completion is dropped."""
    path = tmp_path_factory.mktemp("completion_abort")
    make_hf_model(path)
    return LLM(
        path,
        device="cpu",
        kvcache_block_size=8,
        num_kvcache_blocks=96,
        max_num_seqs=8,
        decode_lookahead=request.param,
    )


def _run(llm: LLM, prompt: list[int], request_id: str) -> dict[int, list[int]]:
    """Steps until the request ended: each completion's tokens."""
    tokens: dict[int, list[int]] = {i: [] for i in range(SP.n)}
    while request_id in llm.requests:
        for o in llm.step():
            tokens[o.seq.index] += o.new_token_ids
    return tokens


def test_abort_completion_2_of_4_mid_decode(llm):
    prompt = prompts_of([20], seed=3)[0]
    reference = _run_with(llm, prompt, "ref")
    assert_clean(llm)

    parent = llm.add_request(prompt, SP, request_id="r")
    tokens: dict[int, list[int]] = {i: [] for i in range(SP.n)}
    for _ in range(4):  # prefill + fork, then three decode steps
        for o in llm.step():
            tokens[o.seq.index] += o.new_token_ids
    group = parent.group
    assert group is not None and len(group) == 4
    victim = group[2]
    assert victim.index == 2 and not victim.is_finished
    bm = llm.block_manager
    own = [b for b in victim.block_table if bm.blocks[b].ref_count == 1]
    shared = [b for b in victim.block_table if bm.blocks[b].ref_count > 1]
    assert own and shared  # its copy of the last block, and the prompt's full blocks
    free_before = bm.num_free_blocks
    assert llm.abort_completion("r", 2)
    assert victim.finish_reason is FinishReason.ABORT and not victim.block_table
    assert bm.num_free_blocks == free_before + len(own)
    assert all(bm.blocks[b].ref_count == 3 for b in shared)  # kept by the three others
    assert not llm.abort_completion("r", 2)  # already ended
    assert not llm.abort_completion("r", 4)  # out of range
    assert "r" in llm.requests
    for index, new in _run(llm, prompt, "r").items():
        tokens[index] += new
    for index in (0, 1, 3):
        assert tokens[index] == reference[index] and len(tokens[index]) == SP.max_tokens
    assert tokens[2] == reference[2][: len(tokens[2])] and len(tokens[2]) < SP.max_tokens
    runner = llm.model_runner
    assert not runner.uses_lookahead or runner.num_foreseen_steps > 0
    assert [q.finish_reason for q in group] == [
        FinishReason.LENGTH,
        FinishReason.LENGTH,
        FinishReason.ABORT,
        FinishReason.LENGTH,
    ]
    assert_clean(llm)


def test_abort_before_the_fork_and_of_every_completion(llm):
    prompt = prompts_of([13], seed=4)[0]
    reference = _run_with(llm, prompt, "ref")
    parent = llm.add_request(prompt, SP, request_id="early")
    assert llm.abort_completion("early", 0) and llm.abort_completion("early", 3)  # still waiting
    assert not llm.abort_completion("early", 3)
    tokens = _run(llm, prompt, "early")
    group = parent.group
    assert group is not None and [q.finish_reason for q in group] == [
        FinishReason.ABORT,
        FinishReason.LENGTH,
        FinishReason.LENGTH,
        FinishReason.ABORT,
    ]
    assert tokens[1] == reference[1] and tokens[2] == reference[2] and not tokens[3]
    assert_clean(llm)
    # aborting each completion in turn ends the request
    llm.add_request(prompt, SP, request_id="all")
    llm.step()
    for index in range(SP.n):
        assert llm.abort_completion("all", index)
    assert "all" not in llm.requests
    assert_clean(llm)
    # n = 1: the request ends
    llm.add_request(prompt, SamplingParams(max_tokens=8), request_id="one")
    assert not llm.abort_completion("one", 1) and llm.abort_completion("one", 0)
    assert_clean(llm)


def _run_with(llm: LLM, prompt: list[int], request_id: str) -> dict[int, list[int]]:
    llm.add_request(prompt, SP, request_id=request_id)
    return _run(llm, prompt, request_id)


class Sink:
    """The core's end of the pipe: the frames AsyncEngine sends, decoded."""

    def __init__(self) -> None:
        self.frames: list[list] = []

    def send_bytes(self, data: bytes) -> None:
        self.frames.append(list(read_inbox(data)))


def bookkeeping_engine() -> AsyncEngine:
    """An AsyncEngine without its core process (call in a running loop): streams, frames out."""
    engine = AsyncEngine.__new__(AsyncEngine)
    engine.loop, engine.to_core, engine.error = asyncio.get_running_loop(), Sink(), None
    engine.adds, engine.aborts, engine.completion_aborts = [], [], []
    engine.flush_scheduled, engine.histograms, engine.num_finished = False, None, 0
    engine.streams, engine.by_request_id, engine.load = {}, {}, None
    engine.history = collections.deque()
    return engine


LOAD = [0.0] + [0] * 10
FINISH = ["length", 3, 2, 0, None, 0.0, 0.0, 0.0]
# completion 0 gets two ids and ends; completion 1 gets one (as the core sends them: arrays)
STEP = Step(LOAD, [[5, [7, 8], FINISH, 0, None, None], [5, [9], None, 1, None, None]], 0.0, [])


def test_async_engine_counts_an_aborted_completion_as_ended():
    """AsyncEngine.abort_completion: the completion ends without output (late ids from the core are
    dropped), the others still report; aborting the last open one releases the whole request."""

    async def main() -> None:
        engine = bookkeeping_engine()
        stream = Stream("r", 5, Collector(), completions=[Completion() for _ in range(3)])
        engine.streams[5] = stream
        assert engine.abort_completion(stream, 1)
        assert not engine.abort_completion(stream, 1) and not engine.abort_completion(stream, 3)
        await asyncio.sleep(0)  # the flush
        assert engine.to_core.frames == [[[], [], False, [[5, 1]]]]
        engine._on_step(STEP)
        assert [t.index for t in stream.take()] == [0]  # completion 1's late id is dropped
        assert not stream.finished and 5 in engine.streams
        assert engine.abort_completion(stream, 2)  # the last open one: the request ends
        assert stream.finished and 5 not in engine.streams
        await asyncio.sleep(0)
        assert engine.to_core.frames[-1] == [[], [5], False, []]

    asyncio.run(main())


def test_session_writes_what_the_others_left_when_the_last_open_one_is_aborted():
    """A completion's finish still waiting in the session when the frontend aborts the request's
    last open completion is written all the same, and the request leaves the session."""

    async def main() -> None:
        engine = bookkeeping_engine()
        session = WorkerSession(engine, 8, check_ready=lambda: engine)
        stream = Stream("r", 5, owner=session.collector)
        stream.completions += [Completion()]
        engine.streams[5], session.live["r"] = stream, stream
        engine._on_step(STEP)  # 0 ends, not taken
        session.abort_completion("r", 1)  # the frontend matched a stop string in completion 1
        session.abort_completion("unknown", 0)
        response = session.take_outputs()
        assert [(o.index, list(o.token_ids)) for o in response.outputs] == [(0, [7, 8])]
        assert response.outputs[0].usage.completion_tokens == 2
        assert "r" not in session.live and 5 not in engine.streams
        await asyncio.sleep(0)
        assert engine.to_core.frames == [[[], [5], False, []]]

    asyncio.run(main())
