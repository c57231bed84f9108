"""Paged KV-cache block allocation with reference counts, prefix caching and copy-on-write (the n
completions of a request share its prompt's blocks). Owned by the Scheduler.

A block is registered in the prefix cache only once its KV has been computed, under a SHA-256 hash
chained over all tokens before it, so a crafted prompt cannot alias another prompt's blocks. A freed
block keeps its hash until it is reused, so a later identical prefix still hits it (LRU eviction).
A sequence's cache salt (its tenant) seeds the chain: blocks are shared only under equal salts.
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Collection, Iterator

from nanoserve.worker.sequence import Sequence


class Block:
    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None
        self.token_ids: tuple[int, ...] = ()


def blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


def chain_hash(token_ids: list[int], prefix_hash: bytes | None) -> bytes:
    h = hashlib.sha256(prefix_hash or b"")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def salt_hash(cache_salt: str | None) -> bytes | None:
    """The prefix hash of a sequence's first block: None (the shared cache) without a salt. The
    domain tag keeps it apart from any chained hash of token ids."""
    if not cache_salt:
        return None
    return hashlib.sha256(b"nanoserve cache salt\0" + cache_salt.encode("utf-8")).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[bytes, int] = {}  # the block a prefix lookup finds
        # other blocks computed with the same content (two identical prompts in one batch): one
        # takes over the lookup when the first is evicted
        self.duplicate_block_ids: dict[bytes, set[int]] = {}
        # insertion-ordered set: blocks freed longest ago are reused first (LRU eviction);
        # OrderedDict pops its front in O(1), where a dict scans the keys deleted before
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # copy-on-write: (source, destination) block copies the runner makes before the next
        # forward (LLMEngine.step takes them)
        self.pending_copies: list[tuple[int, int]] = []
        self.num_hit_tokens = 0  # prefix-cache statistics
        self.num_queried_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _match_prefix(self, seq: Sequence) -> tuple[list[int], bytes | None]:
        """Ids of cached blocks holding a prefix of seq, and the hash of the block after them
        (None past its last whole block). The block of the last token never counts: its logits
        must be computed, and recomputing into a shared block would race other readers."""
        matched: list[int] = []
        prefix = salt_hash(seq.cache_salt)
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = seq.block_token_ids(i, self.block_size)
            prefix = chain_hash(tokens, prefix)
            block_id = self.hash_to_block_id.get(prefix)
            if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
                return matched, prefix
            matched.append(block_id)
        return matched, None

    def allocate(self, seq: Sequence, wait_for: Collection[bytes] = ()) -> bool:
        """Give seq blocks for all its tokens, reusing cached prefix blocks; False, changing
        nothing, when the free blocks do not suffice, or when the first block past its cached
        prefix is in `wait_for` (being computed: a step later it is a hit; Scheduler.plan_next)."""
        assert not seq.block_table
        # prompt logprobs need the logits of every prompt position: computed, not cached (vLLM)
        matched, missed = ([], None) if seq.needs_prompt_logprobs else self._match_prefix(seq)
        if missed is not None and missed in wait_for:
            return False
        in_use = sum(1 for b in matched if self.blocks[b].ref_count > 0)
        if blocks_for(seq.num_tokens, self.block_size) - in_use > self.num_free_blocks:
            return False
        for block_id in matched:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            assert block.hash is not None  # matched through hash_to_block_id: a cached block
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        for _ in range(blocks_for(seq.num_tokens, self.block_size) - len(matched)):
            seq.block_table.append(self._take_free_block())
        seq.num_computed_tokens = len(matched) * self.block_size
        if seq.num_completion_tokens == 0:  # a recompute after preemption is no new request
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_hit_tokens += seq.num_cached_tokens
            self.num_queried_tokens += seq.num_tokens
        return True

    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict its cached content
            self._unregister(block)
        block.ref_count = 1
        return block_id

    def _unregister(self, block: Block) -> None:
        h = block.hash
        assert h is not None  # only cached (hashed) blocks are registered
        spares = self.duplicate_block_ids.get(h)
        if self.hash_to_block_id.get(h) == block.block_id:
            if spares:
                self.hash_to_block_id[h] = spares.pop()
            else:
                del self.hash_to_block_id[h]
        elif spares:
            spares.discard(block.block_id)
        if spares is not None and not spares:
            del self.duplicate_block_ids[h]
        block.hash, block.token_ids = None, ()

    def deallocate(self, seq: Sequence) -> None:
        # the tail is freed first so that it is evicted before the (more shareable) prefix
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks (n > 1); the first write into a shared block copies
        it (append_slot)."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1

    def append_slot(self, seq: Sequence) -> bool:
        """Make room for the KV of seq's next computed token (its newest, or a fork's last prompt
        token), copying the block it goes into if that is shared; False, changing nothing, when the
        free blocks do not suffice. On the per-step hot path."""
        needed = blocks_for(len(seq.token_ids), self.block_size) - len(seq.block_table)
        if needed <= 0:
            # a block written to is shared only after a fork (prefix hits never take the block of
            # the last token)
            i = seq.num_computed_tokens // self.block_size
            if self.blocks[seq.block_table[i]].ref_count > 1:
                if not self.free_block_ids:
                    return False
                self._copy_on_write(seq, i)
            return True
        if needed > len(self.free_block_ids):
            return False
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())
        return True

    def _copy_on_write(self, seq: Sequence, i: int) -> None:
        """seq's block i becomes a private copy (the others keep the original)."""
        src = seq.block_table[i]
        self.blocks[src].ref_count -= 1  # > 0: others still hold it
        dst = self._take_free_block()
        seq.block_table[i] = dst
        self.pending_copies.append((src, dst))

    def take_copies(self) -> list[tuple[int, int]]:
        """The step's copies, the last one per destination: a copy into a block that was freed
        again (its sequence preempted) and reused is dead, and one gather-scatter must not
        write a destination twice."""
        copies, self.pending_copies = self.pending_copies, []
        if len(copies) > 1:
            copies = [(src, dst) for dst, src in {dst: src for src, dst in copies}.items()]
        return copies

    def reserve_next(self, seq: Sequence) -> bool:
        """Decode lookahead: also make room for the token after seq's newest one, which the runner
        forwards before the newest is appended; False, changing nothing, when no block is free.
        append_slot finds the block in place next step; deallocate frees it with the rest."""
        needed = blocks_for(len(seq.token_ids) + 1, self.block_size) - len(seq.block_table)
        if needed <= 0:
            return True
        if needed > len(self.free_block_ids):
            return False
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())
        return True

    def _new_hashes(self, seq: Sequence, end: int) -> Iterator[tuple[list[int], bytes]]:
        """(tokens, chained hash) of seq's blocks after its hashed ones, up to block `end`."""
        prefix = seq.block_hashes[-1] if seq.block_hashes else salt_hash(seq.cache_salt)
        for i in range(len(seq.block_hashes), end):
            tokens = seq.block_token_ids(i, self.block_size)
            prefix = chain_hash(tokens, prefix)
            yield tokens, prefix

    def hash_blocks(self, seq: Sequence) -> None:
        """Register the blocks whose KV became complete in the last step."""
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= len(seq.block_hashes):
            return
        for tokens, h in self._new_hashes(seq, num_full):
            block = self.blocks[seq.block_table[len(seq.block_hashes)]]
            seq.block_hashes.append(h)
            block.hash, block.token_ids = h, tuple(tokens)
            if h in self.hash_to_block_id:  # an identical block is cached already
                self.duplicate_block_ids.setdefault(h, set()).add(block.block_id)
            else:
                self.hash_to_block_id[h] = block.block_id

    def computing_hashes(self, seqs: list[Sequence]) -> set[bytes]:
        """Hashes of the blocks that step `seqs` completes: registered by hash_blocks after the
        step, so a prompt allocated before then cannot hit them."""
        bs = self.block_size
        return {
            h
            for seq in seqs
            for _, h in self._new_hashes(
                seq, (seq.num_computed_tokens + seq.num_scheduled_tokens) // bs
            )
        }

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0
