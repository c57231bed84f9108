"""frontend.workers.routing: the prefix key, rendezvous order and the balance rule; and the worker pool's
address parsing and resolution (no network: literal addresses and localhost)."""

import asyncio
from collections import Counter

import pytest

from nanoserve.frontend.config import parse_worker_address
from nanoserve.frontend.workers.pool import resolve
from nanoserve.frontend.workers.routing import (
    BalanceRule,
    WorkerLoad,
    choose,
    prefix_key,
    rendezvous_rank,
)

WORKERS = ["10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"]
IDLE = WorkerLoad(queue=0, kv_usage=0.0)


def test_prefix_key_covers_whole_blocks_up_to_the_limit() -> None:
    shared = list(range(100, 164))  # 64 tokens = 4 blocks of 16
    a, b = shared + [1, 2, 3], shared + [7, 8, 9, 10, 11]
    assert prefix_key(a, 16, 64) == prefix_key(b, 16, 64)
    # a partial block is not part of the key (it cannot be a prefix-cache hit)
    assert prefix_key(shared + [1] * 15, 16, 256) == prefix_key(shared + [2] * 15, 16, 256)
    # within the limit the tails differ: different keys
    assert prefix_key(shared + [1] * 16, 16, 256) != prefix_key(shared + [2] * 16, 16, 256)
    # shorter than one block: the whole prompt is the key
    assert prefix_key([1, 2], 16, 64) != prefix_key([1, 3], 16, 64)
    # stable across processes (not Python's salted hash)
    assert prefix_key([1, 2, 3], 16, 64).hex() == prefix_key([1, 2, 3], 16, 64).hex()
    assert len(prefix_key([], 16, 64)) == 16


def test_rendezvous_spreads_keys_and_moves_few_when_a_worker_leaves() -> None:
    keys = [prefix_key([n, n + 1], 16, 256) for n in range(3000)]
    first = {key: rendezvous_rank(key, WORKERS)[0] for key in keys}
    counts = Counter(first.values())
    assert set(counts) == set(WORKERS)
    assert all(900 <= c <= 1100 for c in counts.values()), counts  # 1000 each expected
    # removing a worker moves only its keys; the rest keep their worker (and its cache)
    remaining = WORKERS[:2]
    for key, worker in first.items():
        if worker in remaining:
            assert rendezvous_rank(key, remaining)[0] == worker
    # the order is total and deterministic
    assert sorted(rendezvous_rank(keys[0], WORKERS)) == sorted(WORKERS)
    assert rendezvous_rank(keys[0], WORKERS) == rendezvous_rank(keys[0], WORKERS[::-1])


def test_balance_rule() -> None:
    rule = BalanceRule(max_queue_gap=8, max_queue_ratio=2.0, kv_full=0.95)
    assert not rule.too_busy(WorkerLoad(8, 0.0), IDLE)  # gap 8 is not more than 8
    assert rule.too_busy(WorkerLoad(9, 0.0), IDLE)
    assert not rule.too_busy(WorkerLoad(30, 0.0), WorkerLoad(20, 0.0))  # gap 10 but ratio 1.5
    assert rule.too_busy(WorkerLoad(41, 0.0), WorkerLoad(20, 0.0))  # gap 21 and ratio 2.05
    assert rule.too_busy(WorkerLoad(0, 0.96), IDLE)  # its KV cache is full, another's is not
    assert not rule.too_busy(WorkerLoad(0, 0.96), WorkerLoad(0, 0.97))  # all full: stay
    least = WorkerLoad(3, 0.5)
    assert not rule.too_busy(least, least)


def test_choose_keeps_affinity_until_the_preferred_worker_is_much_busier() -> None:
    rule = BalanceRule()
    key = prefix_key(list(range(64)), 16, 64)
    first, second, third = rendezvous_rank(key, WORKERS)
    loads = dict.fromkeys(WORKERS, IDLE)
    assert choose(key, loads, rule) == first
    loads[first] = WorkerLoad(8, 0.2)  # busier, not much busier: the cache wins
    assert choose(key, loads, rule) == first
    loads[first] = WorkerLoad(20, 0.2)  # much busier: the prefix's second choice, not a random one
    assert choose(key, loads, rule) == second
    loads[second] = WorkerLoad(20, 0.2)
    assert choose(key, loads, rule) == third
    loads[third] = WorkerLoad(20, 0.2)  # all equally busy: back to the first
    assert choose(key, loads, rule) == first
    assert choose(key, {WORKERS[1]: WorkerLoad(100, 1.0)}, rule) == WORKERS[1]


def test_parse_worker_address() -> None:
    assert parse_worker_address("a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    for bad in ("nohost", "a:1,", "a:x", ":5", "a:0", "a:70000"):
        with pytest.raises(ValueError, match="worker_address"):
            parse_worker_address(bad)


def test_resolve_literal_and_names() -> None:
    async def main() -> None:
        assert await resolve("10.1.2.3", 5) == {"10.1.2.3:5"}
        assert await resolve("::1", 5) == {"[::1]:5"}
        # localhost is 127.0.0.1 and ::1: only the IPv4 address is kept (a worker bound to
        # 127.0.0.1 never answers on ::1)
        assert await resolve("localhost", 5) == {"127.0.0.1:5"}

    asyncio.run(main())
