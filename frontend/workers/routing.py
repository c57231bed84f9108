"""Which worker serves a request (the frontend, between tokenizing and WorkerSession.start):
rendezvous hashing over the prompt's first KV blocks keeps a shared prefix on the worker that has
it cached; the balance rule overrules it when that worker is much busier than the least-loaded one.
"""

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Prompts that share their first this-many tokens (rounded down to whole KV blocks) share a worker.
DEFAULT_PREFIX_TOKENS = 256


def prefix_key(prompt_ids: Sequence[int], block_size: int, prefix_tokens: int) -> bytes:
    """A stable digest of the prompt's leading whole KV blocks, at most `prefix_tokens` tokens (and
    at least one block). A prompt shorter than one block has nothing the prefix cache can reuse:
    its whole self is hashed, which spreads such prompts evenly.

    blake2b, not hash(): every frontend process must compute the same key for the same prompt, so
    that frontends sharing workers send a prefix to the same one."""
    block_size = max(block_size, 1)
    num_blocks = min(len(prompt_ids), max(prefix_tokens, block_size)) // block_size
    n = num_blocks * block_size or len(prompt_ids)
    ids = array("I", prompt_ids[:n])  # token ids are < 2**32 (vocab_size is a uint32)
    return hashlib.blake2b(ids.tobytes(), digest_size=16).digest()


def rendezvous_rank(key: bytes, workers: Sequence[str]) -> list[str]:
    """Workers by highest random weight for `key`, best first. Adding or removing a worker moves
    only the keys that ranked it first (about 1/N of them), so the others keep their cache."""

    def weight(worker: str) -> bytes:
        return hashlib.blake2b(key + worker.encode(), digest_size=8).digest()

    return sorted(workers, key=weight, reverse=True)


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What routing reads of a worker's load."""

    queue: int  # requests running + waiting at the worker, including ones sent since its report
    kv_usage: float  # fraction of its KV blocks in use, in [0, 1]


@dataclass(frozen=True, slots=True)
class BalanceRule:
    """A worker is too busy to take a request it is preferred for when its queue exceeds the
    least-loaded worker's by more than `max_queue_gap` requests AND by more than `max_queue_ratio`
    times, or when its KV cache is at least `kv_full` used while the least-loaded one's is not
    (it would preempt). Both queue conditions together: small absolute gaps on idle workers and
    proportional gaps on busy ones are both noise that is cheaper than losing the prefix cache."""

    max_queue_gap: int = 8
    max_queue_ratio: float = 2.0
    kv_full: float = 0.95

    def too_busy(self, load: WorkerLoad, least: WorkerLoad) -> bool:
        if load.queue - least.queue > self.max_queue_gap and (
            load.queue > self.max_queue_ratio * least.queue
        ):
            return True
        return load.kv_usage >= self.kv_full > least.kv_usage


def choose(key: bytes, loads: Mapping[str, WorkerLoad], rule: BalanceRule) -> str:
    """The first worker in `key`'s rendezvous order that is not too busy next to the least-loaded
    one. A prefix that overflows its first choice goes to its second, the same for every
    request with that prefix, so the overflow is cached there too. `loads` must not be empty."""
    least = min(loads.values(), key=lambda load: (load.queue, load.kv_usage))
    ranked = rendezvous_rank(key, list(loads))
    for worker in ranked:
        if not rule.too_busy(loads[worker], least):
            return worker
    return ranked[0]  # not reached: the least-loaded worker is never too busy next to itself
