"""Scheduler + BlockManager without a model: reference counts, prefix hits and the hash table stay
consistent under any interleaving of adds, steps, preemptions and aborts (hypothesis)."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.sampling import SamplingParams
from nanoserve.worker.core.block_manager import BlockManager, chain_hash, salt_hash
from nanoserve.worker.core.scheduler import Scheduler
from nanoserve.worker.sequence import Sequence


def make(num_blocks=16, block_size=4, max_num_seqs=8, max_tokens=64) -> Scheduler:
    return Scheduler(max_num_seqs, max_tokens, 10_000, (0,), BlockManager(num_blocks, block_size))


def check_invariants(s: Scheduler) -> None:
    bm = s.block_manager
    holders: dict[int, int] = {}
    for seq in list(s.running) + list(s.waiting):
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0)
        assert (block.ref_count == 0) == (block.block_id in bm.free_block_ids)
    for h, block_id in bm.hash_to_block_id.items():
        block = bm.blocks[block_id]
        assert block.hash == h and len(block.token_ids) == bm.block_size
    for h, block_ids in bm.duplicate_block_ids.items():  # findable once the first is evicted
        assert block_ids and bm.hash_to_block_id[h] not in block_ids
        assert all(bm.blocks[b].hash == h for b in block_ids)
    # a running sequence has blocks for every token but the newest (its KV comes next step)
    for seq in s.running:
        assert len(seq.block_table) * bm.block_size >= seq.num_tokens - 1


def test_prefix_hit_skips_computed_blocks():
    s = make()
    a = Sequence(list(range(10)), SamplingParams(max_tokens=2))
    s.add(a)
    seqs, prefill = s.schedule()
    assert prefill and seqs == [a] and a.num_scheduled_tokens == 10
    s.postprocess(seqs, [5])
    b = Sequence(list(range(10)) + [99], SamplingParams(max_tokens=2))
    s.add(b)
    seqs, prefill = s.schedule()
    # decode-first: a decodes in the same step as b's prefill
    assert seqs == [a, b] and a.num_scheduled_tokens == 1
    assert b.num_cached_tokens == 8 and b.num_scheduled_tokens == 3
    assert b.block_table[:2] == a.block_table[:2]
    assert s.block_manager.blocks[a.block_table[0]].ref_count == 2


def test_last_token_block_is_never_a_hit():
    s = make()
    a = Sequence(list(range(8)), SamplingParams(max_tokens=1))
    s.add(a)
    s.postprocess(s.schedule()[0], [1])
    b = Sequence(list(range(8)), SamplingParams(max_tokens=1))
    s.add(b)
    s.schedule()
    assert b.num_cached_tokens == 4 and b.num_scheduled_tokens == 4  # block 2 holds the last token


def test_freed_block_keeps_hash_until_reused():
    s = make(num_blocks=4)
    a = Sequence(list(range(9)), SamplingParams(max_tokens=1))
    s.add(a)
    s.postprocess(s.schedule()[0], [1])  # finishes (max_tokens=1) and frees its blocks
    assert s.block_manager.num_free_blocks == 4 and len(s.block_manager.hash_to_block_id) == 2
    b = Sequence(list(range(9)), SamplingParams(max_tokens=1))
    s.add(b)
    s.schedule()
    assert b.num_cached_tokens == 8


def test_chain_hash_depends_on_whole_prefix():
    assert chain_hash([1, 2], None) != chain_hash([1, 2], chain_hash([3], None))
    assert chain_hash([1, 2], None) != chain_hash([2, 1], None)
    assert chain_hash([256], None) != chain_hash([1, 0], None)  # no byte-packing aliasing


def prefill_then_repeat(first_salt: str | None, second_salt: str | None) -> tuple[list, Sequence]:
    """One 9-token prompt under `first_salt`, run to its end (its 2 full blocks stay cached); then
    the same prompt under `second_salt`, scheduled once. Returns the first one's block table and
    the second sequence."""
    s = make()
    a = Sequence(list(range(9)), SamplingParams(max_tokens=1), cache_salt=first_salt)
    s.add(a)
    seqs, _ = s.schedule()
    first_blocks = list(a.block_table)
    s.postprocess(seqs, [1])
    b = Sequence(list(range(9)), SamplingParams(max_tokens=1), cache_salt=second_salt)
    s.add(b)
    s.schedule()
    check_invariants(s)
    return first_blocks, b


def test_a_cache_salt_isolates_the_prefix_cache():
    """Equal tokens under different salts (tenants) share no block; equal salts do, as the
    unsalted cache does; a salted prompt never hits the unsalted cache or the reverse."""
    for first, second in [("tenant-a", "tenant-b"), ("tenant-a", None), (None, "tenant-a")]:
        first_blocks, b = prefill_then_repeat(first, second)
        assert b.num_cached_tokens == 0 and b.num_scheduled_tokens == 9, (first, second)
        assert not set(first_blocks) & set(b.block_table), (first, second)
    for salt in ("tenant-a", None):
        first_blocks, b = prefill_then_repeat(salt, salt)
        assert b.num_cached_tokens == 8 and b.num_scheduled_tokens == 1, salt
        assert b.block_table[:2] == first_blocks[:2], salt


def test_the_salt_seeds_the_first_blocks_hash():
    assert salt_hash(None) is None and salt_hash("") is None
    assert salt_hash("a") != salt_hash("b")
    assert chain_hash([1, 2], salt_hash("a")) != chain_hash([1, 2], None)
    assert chain_hash([1, 2], salt_hash("a")) != chain_hash([1, 2], salt_hash("b"))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    num_blocks=st.integers(6, 24),
    block_size=st.sampled_from([2, 4, 8]),
    budget=st.integers(4, 40),
)
def test_random_workload_keeps_invariants(seed, num_blocks, block_size, budget):
    rng = random.Random(seed)
    s = make(num_blocks, block_size, max_num_seqs=rng.randint(1, 6), max_tokens=budget)
    capacity = num_blocks * block_size
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    live = []
    for _ in range(120):
        r = rng.random()
        if r < 0.25:
            prompt = rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randint(0, 6))]
            max_tokens = rng.randint(1, 12)
            if len(prompt) + max_tokens <= capacity:
                sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
                seq = Sequence(prompt, sp, cache_salt=rng.choice([None, None, "tenant-a"]))
                s.add(seq)
                live.append(seq)
        elif r < 0.32 and live:
            s.abort(live.pop(rng.randrange(len(live))))
        else:
            seqs, _ = s.schedule()
            s.postprocess(seqs, [rng.randrange(1, 50) for _ in seqs])
            live = [q for q in live if not q.is_finished]
        check_invariants(s)
    for seq in live:
        s.abort(seq)
    assert s.is_finished() and s.block_manager.num_free_blocks == num_blocks
    check_invariants(s)


def test_admission_fills_max_num_seqs_in_one_step():
    """An admitted prompt is counted once: 8 waiting with max_num_seqs=8 prefill in one step of 8
    (not 4, 2, 1, 1)."""
    s = make(num_blocks=64, max_num_seqs=8)
    for i in range(8):
        s.add(Sequence([i + 1, 2, 3], SamplingParams(max_tokens=4)))
    seqs, prefill = s.schedule()
    assert prefill and len(seqs) == 8 and not s.waiting and len(s.running) == 8
    s.postprocess(seqs, [5] * 8)
    s.add(Sequence([9, 9, 9], SamplingParams(max_tokens=4)))
    seqs, prefill = s.schedule()  # the batch is full: the ninth waits, the eight decode
    assert not prefill and len(seqs) == 8 and len(s.waiting) == 1


def test_identical_block_takes_over_when_the_first_is_evicted():
    """Two identical prompts prefilled in one step compute the same blocks; the second copy is
    registered too, so once the first copy is evicted a third identical prompt still hits."""
    s = make(num_blocks=8)
    prompt = list(range(9))
    a = Sequence(prompt, SamplingParams(max_tokens=1))
    b = Sequence(prompt, SamplingParams(max_tokens=8))
    s.add(a)
    s.add(b)
    seqs, _ = s.schedule()
    assert seqs == [a, b] and b.num_cached_tokens == 0
    s.postprocess(seqs, [1, 1])  # a finishes; its blocks are free but still cached
    check_invariants(s)
    filler = Sequence([100 + i for i in range(20)], SamplingParams(max_tokens=1))
    s.add(filler)  # takes the free blocks, a's first (LRU): a's cached content is evicted
    seqs, _ = s.schedule()
    assert filler in seqs
    s.postprocess(seqs, [1] * len(seqs))
    check_invariants(s)
    c = Sequence(prompt, SamplingParams(max_tokens=1))
    s.add(c)
    s.schedule()
    assert c.num_cached_tokens == 8 and c.block_table[:2] == b.block_table[:2]
    check_invariants(s)


def test_free_blocks_are_reused_least_recently_freed_first():
    bm = BlockManager(6, 4)
    seqs = [Sequence([i] * 4, SamplingParams()) for i in range(3)]
    for seq in seqs:
        bm.allocate(seq)
    taken = [seq.block_table[0] for seq in seqs]
    for seq in (seqs[2], seqs[0]):
        bm.deallocate(seq)
    # the never-used blocks first, then in the order freed
    assert [bm._take_free_block() for _ in range(5)] == [3, 4, 5, taken[2], taken[0]]


def test_decodes_first_and_prompts_fill_the_budget():
    """Decode-first mixed steps (vLLM v1): an arrival is prefilled in the same step as the running
    decodes, and a prompt longer than the token budget runs in chunks beside them, never pausing
    them (before: every prefill step, each chunk included, was a step without decodes)."""
    s = make(num_blocks=64, max_tokens=8)  # max_num_batched_tokens = 8
    a = Sequence([1, 2, 3], SamplingParams(max_tokens=20))
    s.add(a)
    seqs, prefill = s.schedule()
    s.postprocess(seqs, [7])
    long = Sequence(list(range(10, 30)), SamplingParams(max_tokens=2))  # 20 tokens: 3 chunks
    s.add(long)
    chunks = []
    while not long.num_completion_tokens:
        seqs, prefill = s.schedule()
        assert prefill and seqs[0] is a and a.num_scheduled_tokens == 1  # a decodes every step
        assert seqs[1:] == [long]
        chunks.append(long.num_scheduled_tokens)
        s.postprocess(seqs, [7] * len(seqs))
        check_invariants(s)
    assert chunks == [7, 7, 6] and a.num_completion_tokens == 4 and long.num_completion_tokens == 1
    seqs, prefill = s.schedule()
    assert not prefill and seqs == [a, long]  # nothing waits: a pure decode step


def test_prompt_tokens_beside_decodes_are_capped_but_not_alone():
    """max_prefill_tokens_while_decoding: a mixed step carries at most that many prompt tokens
    (a burst of arrivals costs the running streams short gaps, not one long one); a step with no
    decodes still fills max_num_batched_tokens."""
    s = Scheduler(8, 16, 10_000, (0,), BlockManager(64, 4), max_prefill_tokens_while_decoding=3)
    first = Sequence(list(range(1, 13)), SamplingParams(max_tokens=20))  # 12 tokens
    s.add(first)
    seqs, prefill = s.schedule()
    assert prefill and seqs == [first] and first.num_scheduled_tokens == 12  # alone: no cap
    s.postprocess(seqs, [7])
    late = [
        Sequence(list(range(20 + 5 * i, 25 + 5 * i)), SamplingParams(max_tokens=2))
        for i in range(2)
    ]
    for seq in late:
        s.add(seq)
    prompt_tokens = []
    while any(seq.num_completion_tokens == 0 for seq in late):
        seqs, prefill = s.schedule()
        assert seqs[0] is first and first.num_scheduled_tokens == 1  # decodes every step
        prompt_tokens.append(
            sum(q.num_scheduled_tokens for q in seqs if q.num_computed_tokens < q.num_prompt_tokens)
        )
        s.postprocess(seqs, [7] * len(seqs))
        check_invariants(s)
    assert prompt_tokens == [3, 3, 3, 1]  # 10 prompt tokens, at most 3 a step


def test_no_admission_in_a_step_that_preempts():
    s = make(num_blocks=3, block_size=2, max_tokens=64)
    a = Sequence([1, 2], SamplingParams(max_tokens=10))
    b = Sequence([3, 4], SamplingParams(max_tokens=10))
    c = Sequence([5], SamplingParams(max_tokens=10))
    s.add(a)
    s.add(b)
    s.postprocess(s.schedule()[0], [5, 5])  # 2 blocks used, 1 free
    s.add(c)
    seqs, prefill = s.schedule()  # a takes the free block; b has none left and is preempted
    assert seqs == [a] and not prefill and list(s.waiting) == [b, c]
    check_invariants(s)
