"""Per-step sampling inputs: SamplingTensors built from the scheduled Sequences' parameters (one
copy per field), the penalties' token statistics kept between steps, the (seed, position) of
the seeded rows, and logit_bias / allowed_token_ids (worker.runner.token_rules). ModelRunner.run
hands them, with the logits, to worker.runner.sampler.sample.
"""

from collections.abc import Collection

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device
from nanoserve.worker.runner.sampler import SamplingTensors
from nanoserve.worker.runner.seeded_noise import as_int64
from nanoserve.worker.runner.token_rules import TokenRules
from nanoserve.worker.sequence import Sequence


class SamplingInputs:
    def __init__(self, device: torch.device, vocab_size: int, eos_token_ids: tuple[int, ...] = ()):
        self.device, self.vocab_size = device, vocab_size
        # ids past the vocabulary are never sampled: nothing to mask
        self.eos_token_ids = tuple(t for t in eos_token_ids if t < vocab_size)
        self.penalty_counts = PenaltyCounts(device, vocab_size)
        self.token_rules = TokenRules(device)

    def prepare(self, seqs: list[Sequence]) -> SamplingTensors:
        params = [seq.sampling_params for seq in seqs]
        t = SamplingTensors(
            temperatures=None,
            top_ks=None,
            top_ps=None,
            min_ps=None,
            all_greedy=all(p.greedy for p in params),
        )
        if any(p.has_penalties for p in params):
            self._penalty_tensors(seqs, t)
        if any(p.min_tokens for p in params):
            self._banned_tokens(seqs, t)
        if any(p.has_token_rules for p in params):
            self.token_rules.fill(seqs, t)
        if any(p.structured_output for p in params):
            mask = grammar_bitmask(seqs, self.vocab_size)
            if mask is not None:
                no_token_left(seqs, *mask)
                every = len(mask[0]) == len(seqs)
                rows = None if every else to_device(mask[0], self.device)
                t.allowed = (rows, mask[1].to(self.device, non_blocking=True))
        if t.all_greedy:  # argmax only: no per-row tensors to copy
            return t
        vocab = self.vocab_size
        # one host->device copy: (4, B) rows of temperature, top-k, top-p, min-p
        knobs = [p.knobs for p in params]  # (temperature, top_k, top_p, min_p) per row
        rows = to_device(
            [
                [0.0 if p.greedy else k[0] for p, k in zip(params, knobs)],
                [k[1] if k[1] > 0 else vocab for k in knobs],
                [k[2] for k in knobs],
                [k[3] for k in knobs],
            ],
            self.device,
            torch.float32,
        )
        t.temperatures = rows[0]
        if any(k[1] > 0 for k in knobs):
            t.top_ks = rows[1].long()
            t.max_top_k = max(k[1] if k[1] > 0 else vocab for k in knobs)
        if any(k[2] < 1 for k in knobs):
            t.top_ps = rows[2]
        if any(k[3] > 0 for k in knobs):
            t.min_ps = rows[3]
        seeded = [i for i, p in enumerate(params) if p.seed is not None]
        if seeded:
            # one copy: (3, S) rows, seeds (as int64 bit patterns), output positions; a recomputed
            # (preempted) sequence keeps its tokens, so its next position and noise are unchanged
            columns = to_device(
                [
                    seeded,
                    [as_int64(params[i].seed or 0) for i in seeded],
                    [seqs[i].num_completion_tokens for i in seeded],
                ],
                self.device,
                torch.int64,
            )
            t.seeded = (columns[0], columns[1], columns[2])
            t.num_seeded = len(seeded)
        return t

    def _penalty_tensors(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Penalty factors (one copy for the batch) and the rows of the persistent token
        statistics (PenaltyCounts), which only count each step's new tokens."""
        params = [seq.sampling_params for seq in seqs]
        factors = to_device(
            [
                [p.repetition_penalty for p in params],
                [p.presence_penalty for p in params],
                [p.frequency_penalty for p in params],
            ],
            self.device,
            torch.float32,
        )
        t.repetition_penalties, t.presence_penalties, t.frequency_penalties = factors
        t.penalty_rows = self.penalty_counts.rows(seqs)
        t.prompt_mask = self.penalty_counts.prompt_mask
        t.output_counts = self.penalty_counts.output_counts

    def _banned_tokens(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Rows that have not yet produced min_tokens may not sample eos (unless ignore_eos) or a
        stop id: the token sampled now is completion token number num_completion_tokens + 1."""
        rows: list[int] = []
        ids: list[int] = []
        for i, seq in enumerate(seqs):
            sp = seq.sampling_params
            # a grammar decides where the output ends: it allows the eos only then
            if seq.num_completion_tokens >= sp.min_tokens or seq.grammar is not None:
                continue
            banned = set(sp.stop_token_ids)
            if not sp.ignore_eos:
                banned.update(self.eos_token_ids)
            rows += [i] * len(banned)
            ids += banned
        if rows:
            t.banned = (to_device(rows, self.device), to_device(ids, self.device))

    def release(self, seq: Sequence) -> None:
        """Forget per-request state of a finished or aborted sequence."""
        self.penalty_counts.release(seq)
        self.token_rules.release(seq)


def no_token_left(seqs: list[Sequence], rows: list[int], bitmask: torch.Tensor) -> None:
    """Sets seq.error on a row whose grammar allows none of its allowed_token_ids: it would sample
    from a row of -inf (token 0); LLMEngine.step ends its request instead, INVALID_ARGUMENT."""
    for g, i in enumerate(rows):
        allowed = seqs[i].sampling_params.allowed_token_ids
        if allowed is not None and allows_none_of(bitmask[g], allowed):
            seqs[i].error = (
                "allowed_token_ids: none of them is valid for the structured output at "
                f"completion token {seqs[i].num_completion_tokens + 1}"
            )


class PenaltyCounts:
    """Which tokens each sequence with penalties has seen, kept on the device between steps (vLLM
    v1 keeps them in its persistent batch): slot s holds one sequence's prompt mask and output
    counts, filled once from its tokens and then updated with each step's new ones. Slot 0 stays
    empty: rows without penalties read it (their factors make it a no-op anyway)."""

    def __init__(self, device: torch.device, vocab_size: int):
        self.device, self.vocab_size = device, vocab_size
        self.prompt_mask = torch.zeros(1, vocab_size, dtype=torch.bool, device=device)  # (S, V)
        self.output_counts = torch.zeros(1, vocab_size, dtype=torch.float32, device=device)
        self.slot_of: dict[int, int] = {}  # seq_id -> slot
        self.num_counted: dict[int, int] = {}  # seq_id -> its tokens already in the statistics
        self.free_slots: list[int] = []  # released slots, emptied when reused

    @torch.inference_mode()  # the statistics are inference tensors (made under ModelRunner.run)
    def rows(self, seqs: list[Sequence]) -> torch.Tensor:
        """(B,) slot of each sequence, after counting the tokens each gained since the last call
        (all of them for a sequence seen the first time): a few copies for the whole batch."""
        slots, new = [], []
        out_slots, out_ids = [], []  # output tokens to add, one entry per occurrence
        for seq in seqs:
            if not seq.sampling_params.has_penalties:
                slots.append(0)
                continue
            slot = self.slot_of.get(seq.seq_id)
            if slot is None:
                slot = self.free_slots.pop() if self.free_slots else len(self.slot_of) + 1
                self.slot_of[seq.seq_id] = slot
                self.num_counted[seq.seq_id] = seq.num_prompt_tokens
                new.append((slot, seq))
            counted = self.num_counted[seq.seq_id]
            if counted < seq.num_tokens:
                fresh = seq.token_ids[counted:]
                out_slots += [slot] * len(fresh)
                out_ids += fresh
                self.num_counted[seq.seq_id] = seq.num_tokens
            slots.append(slot)
        if new:
            self._grow(max(slot for slot, _ in new) + 1)
            self._fill_prompts(new)
        if out_ids:
            index = (to_device(out_slots, self.device), to_device(out_ids, self.device))
            self.output_counts.index_put_(
                index, torch.ones(len(out_ids), device=self.device), accumulate=True
            )
        return to_device(slots, self.device)

    def _grow(self, num_slots: int) -> None:
        have = self.prompt_mask.shape[0]
        if num_slots <= have:
            return
        num_slots = max(num_slots, have + have // 2, 16)  # few regrowths as the batch fills
        extra = num_slots - have
        self.prompt_mask = torch.cat(
            [self.prompt_mask, self.prompt_mask.new_zeros(extra, self.vocab_size)]
        )
        self.output_counts = torch.cat(
            [self.output_counts, self.output_counts.new_zeros(extra, self.vocab_size)]
        )

    def _fill_prompts(self, new: list[tuple[int, Sequence]]) -> None:
        """Empty the new sequences' slots (a reused slot holds its last owner's) and mark their
        prompt tokens."""
        slots = to_device([slot for slot, _ in new], self.device)
        self.prompt_mask[slots] = False
        self.output_counts[slots] = 0
        rows = np.repeat([slot for slot, _ in new], [seq.num_prompt_tokens for _, seq in new])
        ids = np.fromiter(
            (tok for _, seq in new for tok in seq.token_ids[: seq.num_prompt_tokens]),
            dtype=np.int64,
            count=len(rows),
        )
        self.prompt_mask[to_device(rows, self.device), to_device(ids, self.device)] = True

    def release(self, seq: Sequence) -> None:
        slot = self.slot_of.pop(seq.seq_id, None)
        if slot is not None:
            del self.num_counted[seq.seq_id]
            self.free_slots.append(slot)


def grammar_bitmask(seqs: list[Sequence], vocab_size: int) -> tuple[list[int], torch.Tensor] | None:
    """(rows, (G, ceil(V/32)) int32 bitmask on the host) of the rows of seqs that have a grammar:
    bit t of row g set = token t allowed. None when no row has one."""
    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
    if not rows:
        return None
    bitmask = torch.empty(len(rows), (vocab_size + 31) // 32, dtype=torch.int32)
    for g, i in enumerate(rows):
        grammar = seqs[i].grammar
        assert grammar is not None
        grammar.fill(bitmask, g)
    return rows, bitmask


def allows_none_of(bitmask_row: torch.Tensor, token_ids: Collection[int]) -> bool:
    """Whether a host bitmask row ((ceil(V/32),) int32 words) clears every one of token_ids: a
    grammar and allowed_token_ids that leave a row no token at all."""
    words = bitmask_row.numpy().view(np.uint32)
    ids = np.asarray(token_ids, dtype=np.int64)
    return not ((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).any()
