"""LLMEngine.abort_completion: one of an n > 1 request's completions ends early (its caller matched
a stop string); its own blocks are freed, the blocks it shares stay with the others, which finish
with the tokens they would have had, and the request ends when they have."""

import pytest
from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.engine.sequence import FinishReason

from tests.unit.hf_reference import make_hf_model
from tests.unit.test_engine_parity import assert_clean, prompts_of

SP = SamplingParams(temperature=0.8, seed=11, max_tokens=16, ignore_eos=True, n=4)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("completion_abort")
    make_hf_model(path)
    return LLM(path, device="cpu", kvcache_block_size=8, num_kvcache_blocks=96, max_num_seqs=8)


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
