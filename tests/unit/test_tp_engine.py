"""Tensor parallelism on CPU (gloo): size 2 gives exactly the greedy tokens of size 1 through the
offline API, with KV heads split and replicated; sizes that cannot split the heads are refused."""

import pytest

from nanoserve.worker import LLM, SamplingParams
from tests.unit.hf_reference import hf_greedy, make_hf_model

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), [3] * 17, [400, 2, 77]]


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv_split", "kv_replicated"])
def test_tp2_equals_transformers(tmp_path, kv_heads):
    hf = make_hf_model(tmp_path, num_key_value_heads=kv_heads, vocab_size=501)
    ref = hf_greedy(hf, PROMPTS, 24)
    llm = LLM(
        tmp_path, device="cpu", tensor_parallel_size=2, kvcache_block_size=16, num_kvcache_blocks=32
    )
    try:
        out = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in out] == ref
        # the second run hits the prefix cache: every rank takes the same path
        small = llm.generate(PROMPTS * 2, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in small] == ref * 2
        assert llm.block_manager.num_free_blocks == 32
    finally:
        llm.shutdown()
    assert all(not p.is_alive() for p in llm.model_runner.procs)


def test_tp_size_must_divide_heads(tmp_path):
    make_hf_model(tmp_path, num_attention_heads=6, num_key_value_heads=3, head_dim=16)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tmp_path, device="cpu", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tmp_path, device="cpu", tensor_parallel_size=4)


@pytest.mark.parametrize(
    "tp, kv_heads",
    [(4, 4), (4, 2), (8, 2)],
    ids=["tp4_kv_split", "tp4_kv_replicated", "tp8_kv_replicated"],
)
def test_tp_4_and_8_equal_transformers(tmp_path, tp, kv_heads):
    """More ranks than this machine has cores: slow, but the same tokens (gloo on CPU)."""
    hf = make_hf_model(
        tmp_path,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        head_dim=16,
        intermediate_size=128,
        vocab_size=509,
    )
    prompts = PROMPTS[:2]
    ref = hf_greedy(hf, prompts, 12)
    llm = LLM(
        tmp_path,
        device="cpu",
        tensor_parallel_size=tp,
        kvcache_block_size=16,
        num_kvcache_blocks=16,
    )
    try:
        out = llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
        )
        assert [o.token_ids for o in out] == ref
    finally:
        llm.shutdown()


def test_engine_built_in_a_thread_that_ends_survives_it_and_a_dead_rank_raises(tmp_path):
    """Ranks belong to the process, not to the thread that built the LLM (PR_SET_PDEATHSIG fires
    when the spawning thread ends); a rank that dies later makes generate raise RankDied into the
    caller, whose process goes on, and shutdown returns."""
    import os
    import signal
    import threading
    import time

    from nanoserve.worker.tp.runner import RankDied

    hf = make_hf_model(tmp_path, num_key_value_heads=2, vocab_size=501)
    ref = hf_greedy(hf, PROMPTS[:1], 24)
    built = {}
    t = threading.Thread(
        target=lambda: built.setdefault(
            "llm",
            LLM(
                tmp_path,
                device="cpu",
                tensor_parallel_size=2,
                kvcache_block_size=16,
                num_kvcache_blocks=32,
            ),
        )
    )
    t.start()
    t.join()
    llm = built["llm"]
    try:
        time.sleep(1.0)  # a rank killed with the thread would be gone by now
        assert all(p.is_alive() for p in llm.model_runner.procs)
        assert [o.token_ids for o in llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)] == ref
        rank = llm.model_runner.procs[0]
        os.kill(rank.pid, signal.SIGKILL)
        rank.join(5)
        with pytest.raises(RankDied, match="rank 1"):
            llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    finally:
        start = time.monotonic()
        llm.shutdown()
        assert time.monotonic() - start < 15.0
    import torch.distributed as dist

    assert not dist.is_initialized()  # the next engine of this process is not taken for a rank


def test_a_rank_that_dies_before_the_rendezvous_fails_the_start_instead_of_hanging(tmp_path):
    """E.g. a group SIGTERM while the ranks still import torch: rank 0 stops waiting for it."""
    import multiprocessing as mp
    import os
    import signal
    import threading
    import time

    from nanoserve.worker.tp.runner import RankDied

    make_hf_model(tmp_path, num_key_value_heads=2, vocab_size=501)
    outcome = {}

    def build():
        try:
            outcome["llm"] = LLM(
                tmp_path,
                device="cpu",
                tensor_parallel_size=2,
                kvcache_block_size=16,
                num_kvcache_blocks=32,
            )
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome["error"] = e

    before = set(mp.active_children())
    t = threading.Thread(target=build)
    start = time.monotonic()
    t.start()
    while not (
        ranks := [
            p
            for p in mp.active_children()
            if p not in before and p.name.startswith("nanoserve-tp-rank")
        ]
    ):
        assert time.monotonic() - start < 60
        time.sleep(0.01)
    os.kill(ranks[0].pid, signal.SIGKILL)  # long before it reaches the store
    t.join(30)
    assert not t.is_alive()
    assert isinstance(outcome.get("error"), RankDied), outcome


def test_tp2_n_completions_copy_blocks_on_every_rank(tmp_path):
    """n > 1 under tensor parallelism: the copy-on-write of the shared last block reaches every
    rank (else a rank's completions would read another completion's KV): greedy completions all
    equal transformers' tokens."""
    hf = make_hf_model(tmp_path, vocab_size=501)
    prompts = [[5, 6, 7, 8, 9], [3] * 17]  # a partial last block, and one a token past a full one
    ref = hf_greedy(hf, prompts, 24)
    llm = LLM(
        tmp_path, device="cpu", tensor_parallel_size=2, kvcache_block_size=8, num_kvcache_blocks=32
    )
    try:
        out = llm.generate(
            prompts,
            SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=3),
            use_tqdm=False,
        )
        assert [[c.token_ids for c in o.outputs] for o in out] == [[r] * 3 for r in ref]
        assert llm.block_manager.num_free_blocks == 32
    finally:
        llm.shutdown()
