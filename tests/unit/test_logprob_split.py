"""Bounded logprob entries per message: split_logprobs (shared by both services), the worker's
Taken.pieces (GenerateTokens and Session outputs) and bounded_responses (a SessionResponse)."""

import pytest

from nanoserve.logprob_split import split_logprobs
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.worker.service.admission import add_logprobs
from nanoserve.worker.service.output_stream import Finish, Taken
from nanoserve.worker.service.session import bounded_responses


def _entry(token_id: int) -> list:
    """An engine entry [token_id, logprob, rank, top_ids, top_logprobs]."""
    return [token_id, -1.0, 1, [token_id], [-1.0]]


@pytest.mark.parametrize("num_prompt", [0, 1, 4, 5, 9])
@pytest.mark.parametrize("num_ids", [0, 1, 3, 7])
@pytest.mark.parametrize("with_logprobs", [True, False])
def test_split_keeps_order_and_one_entry_per_id(
    num_prompt: int, num_ids: int, with_logprobs: bool
) -> None:
    ids = list(range(100, 100 + num_ids))
    logprobs = [_entry(i) for i in ids] if with_logprobs else []
    prompt = [_entry(i) for i in range(num_prompt)]
    pieces = split_logprobs(ids, logprobs, prompt, max_entries=4)
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    for p in pieces:
        assert len(p.logprobs) + len(p.prompt_logprobs) <= 4
        if with_logprobs:
            assert [e[0] for e in p.logprobs] == p.ids  # each id with its own entry
        else:
            assert not p.logprobs
    for p in pieces[:-1]:  # no empty piece but the one an empty take gives
        assert p.ids or p.prompt_logprobs
    # prompt entries come before any id (the first token's message ends the prompt's)
    first_ids = next((k for k, p in enumerate(pieces) if p.ids), len(pieces))
    assert not any(p.prompt_logprobs for p in pieces[first_ids + 1 :])
    assert [i for p in pieces for i in p.ids] == ids
    assert [e for p in pieces for e in p.logprobs] == logprobs
    assert [e for p in pieces for e in p.prompt_logprobs] == prompt
    total = num_prompt + (num_ids if with_logprobs else 0)
    assert len(pieces) == max(1, -(-total // 4))  # as few as the bound allows


def test_taken_pieces_carry_the_finish_last() -> None:
    finish = Finish(
        "length", prompt_tokens=9, completion_tokens=3, cached_tokens=0, stop_token_id=None
    )
    taken = Taken(
        0, [7, 8, 9], finish, [_entry(i) for i in (7, 8, 9)], [_entry(i) for i in range(8)]
    )
    pieces = taken.pieces(max_entries=5)
    assert [len(p.ids) for p in pieces] == [0, 2, 1]
    assert [p.finish for p in pieces] == [None, None, finish]
    assert [e[0] for p in pieces for e in p.prompt_logprobs or []] == list(range(8))
    assert all(len(p.logprobs or []) == len(p.ids) for p in pieces)
    small = Taken(1, [5], None, None, None)  # no logprobs asked: never split
    assert small.pieces(max_entries=1) == [small]


def test_session_response_split_by_entries() -> None:
    response = worker_pb2.SessionResponse()
    for request_id, num in (("a", 3), ("b", 0), ("c", 2), ("d", 4), ("e", 1)):
        out = response.outputs.add(request_id=request_id, token_ids=list(range(num)))
        add_logprobs(out.logprobs, [_entry(i) for i in range(num)])
    parts = bounded_responses(response, max_entries=4)
    assert [[o.request_id for o in p.outputs] for p in parts] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert all(sum(len(o.logprobs) for o in p.outputs) <= 4 for p in parts)
    assert bounded_responses(worker_pb2.SessionResponse()) == []
