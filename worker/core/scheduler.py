"""Continuous batching: picks each step's sequences, chunks long prefills, preempts when KV runs out.

LLMEngine.step calls schedule() -> ModelRunner.run -> postprocess(). Decode-first (vLLM v1): every
running sequence decodes one token, and the token budget left is filled with prompts (new ones,
chunks of long ones, recomputes after preemption) in the same forward, so arrivals never pause the
running streams. A step without prompts is a pure decode step (the runner's CUDA graphs).
Priorities (vLLM's priority policy): `waiting` is ordered by (priority, arrival), lower first; when
blocks or batch slots run out, the running sequence with the largest key is preempted.
A request with n > 1 forks into n sequences once its prompt is prefilled (postprocess).
"""

import time
from collections import deque
from itertools import chain

from nanoserve.worker.core.block_manager import BlockManager, blocks_for
from nanoserve.worker.sequence import FinishReason, NextStep, Sequence, SequenceStatus


def _sched_key(seq: Sequence) -> tuple[int, int, int]:
    return seq.sched_key


class Scheduler:
    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...],
        block_manager: BlockManager,
        max_prefill_tokens_while_decoding: int = 0,
    ):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # a mixed step's prompt tokens (0: no cap but the step's): every running stream waits for
        # the step, so a burst of arrivals costs each of them one long gap without it
        self.max_prefill_tokens_while_decoding = (
            max_prefill_tokens_while_decoding or max_num_batched_tokens
        )
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0
        # a sequence with a priority other than 0 came: running ones may be preempted for waiting
        # ones (until the engine is idle again; checked so FCFS pays nothing)
        self.mixed_priorities = False
        # the prompt chunks plan_next put in the next step: schedule() takes them, and only them
        self.planned: list[tuple[Sequence, int]] | None = None

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        if seq.priority != 0:
            self.mixed_priorities = True
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence) -> None:
        """Into `waiting` by sched_key, never ahead of a prompt holding blocks (a chunked prefill
        under way stays at the head). FCFS arrivals append in O(1)."""
        waiting, key = self.waiting, seq.sched_key
        i = len(waiting)
        while i > 0 and waiting[i - 1].sched_key > key and not waiting[i - 1].block_table:
            i -= 1
        if i == len(waiting):
            waiting.append(seq)
        else:
            waiting.insert(i, seq)

    def schedule(self, admit: bool = True) -> tuple[list[Sequence], bool]:
        """(the step's sequences, decodes first; whether any prompt tokens are in it).
        admit=False: the running sequences' decodes only (their step was forwarded ahead). The
        prompts plan_next planned for this step (its forward ran ahead) are admitted, no others."""
        planned, self.planned = self.planned, None
        if not admit:
            return self._schedule_decodes()[0], False
        if planned is not None:
            scheduled, preempted = self._schedule_decodes()
            prompts = [] if preempted else self._schedule_planned(planned)
            return scheduled + prompts, bool(prompts)
        if self.mixed_priorities:
            if self.is_finished():
                self.mixed_priorities = False
            else:
                self._preempt_for_priority()
        scheduled, preempted = self._schedule_decodes()
        if preempted:  # no admission in a step that ran out of blocks (vLLM)
            return scheduled, False
        budget = self.max_num_batched_tokens - len(scheduled)
        if scheduled:
            budget = min(budget, self.max_prefill_tokens_while_decoding)
        prompts = self._schedule_prompts(budget)
        return scheduled + prompts, bool(prompts)

    def _preempt_for_priority(self) -> None:
        """The head of `waiting` has a lower priority value than a running sequence but no room
        (blocks or batch slots): preempt the running ones with the largest keys until it fits."""
        if not self.waiting or not self.running or self.waiting[0].block_table:
            return
        head = self.waiting[0]
        bm = self.block_manager
        while self.running:
            worst = max(self.running, key=_sched_key)
            if worst.priority <= head.priority:
                return
            fits_batch = len(self.running) + head.num_seats <= self.max_num_seqs
            # the decodes go first and may take blocks; the head's are an upper bound (prefix
            # hits are not counted)
            for_decodes = sum(
                blocks_for(s.num_tokens, bm.block_size) > len(s.block_table) for s in self.running
            )
            needed = blocks_for(head.num_tokens, bm.block_size) + for_decodes
            if fits_batch and needed <= bm.num_free_blocks:
                return
            self.running.remove(worst)
            self.preempt(worst)

    def _schedule_decodes(self) -> tuple[list[Sequence], bool]:
        """One token for each running sequence, preempting the one with the largest sched_key
        (lowest priority, newest) when blocks run out; (the decodes, whether a sequence was
        preempted)."""
        scheduled: list[Sequence] = []
        preempted = False
        append_slot = self.block_manager.append_slot
        while self.running:
            seq = self.running.popleft()
            while not append_slot(seq):
                preempted = True
                victim = max(chain(self.running, scheduled, (seq,)), key=_sched_key)
                if victim is seq:
                    self.preempt(seq)
                    break
                if victim.num_scheduled_tokens:  # given its slot already this step
                    scheduled.remove(victim)
                    victim.num_scheduled_tokens = 0
                else:
                    self.running.remove(victim)
                self.preempt(victim)
            else:
                seq.num_scheduled_tokens = 1
                scheduled.append(seq)
        self.running.extend(scheduled)
        return scheduled, preempted

    def _schedule_prompts(self, budget: int) -> list[Sequence]:
        """Prompt tokens for the budget left by the decodes: the head of `waiting` may be a prompt
        whose earlier chunks already ran. An admitted prompt joins `running` at once, so `running`
        alone counts the batch's sequences."""
        scheduled: list[Sequence] = []
        # batch slots taken: a parent admitted now forks (n > 1) in this step's postprocess
        num_seats = len(self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if num_seats + seq.num_seats > self.max_num_seqs:
                break  # a request with n > 1 needs a slot for each completion
            if not seq.block_table and not self.block_manager.allocate(seq):
                break
            count = min(seq.num_tokens - seq.num_computed_tokens, budget)
            budget -= count
            scheduled.append(seq)
            if not self._take_chunk(seq, count):
                break  # a partial chunk ends the batch; the prompt stays at the head of `waiting`
            num_seats += seq.num_seats
        return scheduled

    def _take_chunk(self, seq: Sequence, count: int) -> bool:
        """Schedules `count` tokens of seq, the head of `waiting`; True when they end its prompt,
        and it joins `running`."""
        seq.num_scheduled_tokens = count
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        if not seq.samples_this_step:
            return False
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def _schedule_planned(self, planned: list[tuple[Sequence, int]]) -> list[Sequence]:
        """The planned chunks that are still at the head of `waiting`, in order (one aborted since
        ends them: the rest are tried as ever next step)."""
        scheduled: list[Sequence] = []
        for seq, count in planned:
            if not self.waiting or self.waiting[0] is not seq:
                break
            scheduled.append(seq)
            if not self._take_chunk(seq, count):
                break
        return scheduled

    def plan_next(self, seqs: list[Sequence]) -> NextStep | None:
        """After scheduling step `seqs`, schedules the step after it now, so that the runner may
        forward it ahead (EngineConfig.lookahead_prompts): the decodes of the sequences that sample
        and do not surely end by length (their next slots reserved), then the prompt chunks that
        the budget and batch admit (their blocks allocated, as _schedule_prompts would); the next
        schedule() takes exactly those. A prompt whose prefix this step is computing is left for
        the step after (allocated now it would miss those blocks). None, planning nothing, when
        it is not foreseeable: a parent forks after this step (n > 1), priorities may preempt, a
        chunk needs prompt rows (prompt logprobs), a slot or a block is missing, or the step
        would sample nothing."""
        if self.mixed_priorities:
            return None
        decodes: list[Sequence] = []
        ending = 0
        for seq in seqs:
            if not seq.samples_this_step:
                continue  # a mid-prompt chunk: it goes on below, as the head of `waiting`
            if seq.group is not None and len(seq.group) < seq.sampling_params.n:
                return None  # it forks in postprocess: the next step has sequences not yet made
            if seq.reaches_length(1, self.max_model_len):
                ending += 1
            elif not self.block_manager.reserve_next(seq):
                return None
            else:
                decodes.append(seq)
        budget = self.max_num_batched_tokens - len(decodes)
        if decodes:
            budget = min(budget, self.max_prefill_tokens_while_decoding)
        num_seats = len(self.running) - ending
        prompts: list[tuple[Sequence, int, int]] = []
        computing: set[bytes] | None = None  # blocks this step completes (made when needed)
        for seq in self.waiting:
            if budget <= 0 or num_seats + seq.num_seats > self.max_num_seqs:
                break
            if seq.needs_prompt_logprobs:
                return None
            if not seq.block_table:
                if computing is None:
                    computing = self.block_manager.computing_hashes(seqs)
                # refused too when its prefix is being computed now (the same system prompt a step
                # apart): planned now it would compute it again; a step later it hits the cache
                if not self.block_manager.allocate(seq, wait_for=computing):
                    break
            start = seq.num_computed_tokens + seq.num_scheduled_tokens  # after this step's chunk
            count = min(len(seq.token_ids) - start, budget)
            prompts.append((seq, start, count))
            budget -= count
            if start + count < len(seq.token_ids):
                break  # a partial chunk ends the step
            num_seats += seq.num_seats
        if not decodes and not any(s + c == len(seq.token_ids) for seq, s, c in prompts):
            return None
        self.planned = [(seq, count) for seq, _, count in prompts]
        return NextStep(decodes, prompts)

    def decode_follows(self, seqs: list[Sequence]) -> bool:
        """After scheduling decode step `seqs`: whether the next step is predictably a decode of
        (a subset of) them, so that the runner may forward it ahead (worker.runner.lookahead).
        Prompt tokens join the next step (a mixed step) only if a sequence can be admitted: the
        batch has room once those that surely end by length this step are gone, and the head of
        `waiting` fits in the free blocks (its own prefix hits are not counted). An end by eos or a
        stop id is not foreseeable: then a prompt may join after all and the forward ahead is
        discarded."""
        if not self.waiting:
            return True
        head = self.waiting[0]
        if (
            self.mixed_priorities
            and not head.block_table
            and any(s.priority > head.priority for s in self.running)
        ):
            return False  # the head may preempt one of them (_preempt_for_priority)
        ending = [seq for seq in seqs if seq.reaches_length(1, self.max_model_len)]
        if len(self.running) - len(ending) + head.num_seats > self.max_num_seqs:
            return True
        if head.block_table:
            return False  # a chunked prefill goes on
        # an upper bound of the blocks free next step: shared blocks of an ending seq may stay held
        free = self.block_manager.num_free_blocks + sum(len(seq.block_table) for seq in ending)
        return blocks_for(head.num_tokens, self.block_manager.block_size) > free

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks; it is recomputed (prompt + output so far) when blocks are available."""
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self._enqueue(seq)
        self.num_preemptions += 1

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> None:
        """Account for the step's work, append the sampled tokens, finish what stopped."""
        num_finished = 0
        now = time.monotonic()  # one clock read per step, for the sequences' phase marks
        forks: list[Sequence] = []
        for seq, token_id in zip(seqs, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.hash_blocks(seq)
            if seq.num_computed_tokens < len(seq.token_ids):
                continue  # a non-final prefill chunk samples nothing
            assert token_id is not None  # ModelRunner.run samples every row that reached its end
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.append_token(token_id)
            reason = None
            if seq.group is not None and len(seq.group) < seq.sampling_params.n:
                forks += self._fork(seq)  # before seq may end: the forks keep its blocks
                if 0 in seq.aborted_indices:  # completion 0 was aborted while it prefilled
                    reason = FinishReason.ABORT
            reason = reason or self._stop_reason(seq, token_id)
            # structured output: the matcher takes every token; a terminated grammar ends it
            if reason is None and seq.grammar is not None and seq.grammar.accept(token_id):
                reason = FinishReason.STOP
            if reason is not None:
                seq.finished_time = now
                self._end(seq, reason)
                num_finished += 1
        self.running.extend(forks)
        if num_finished:  # one pass over `running`, not one removal per finished sequence
            self.running = deque(s for s in self.running if not s.is_finished)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """n > 1: the parent just sampled its first token (it is completion 0); completions
        1..n-1 share its blocks and sample their first tokens in their first decode step, each
        from its own seed stream. Admission kept their batch slots free (num_seats)."""
        sp = parent.sampling_params
        children = []
        for index in range(1, sp.n):
            child = parent.fork(index, sp.for_completion(index))
            if index in parent.aborted_indices:  # aborted while the parent prefilled: no blocks
                child.status, child.finish_reason = SequenceStatus.FINISHED, FinishReason.ABORT
                continue
            self.block_manager.fork(parent, child)
            children.append(child)
        return children

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        sp = seq.sampling_params
        if len(seq.token_ids) - seq.num_prompt_tokens >= sp.min_tokens:
            if (
                token_id in self.eos_token_ids and not sp.ignore_eos
            ) or token_id in sp.stop_token_ids:
                seq.stop_token_id = token_id
                return FinishReason.STOP
        if seq.reaches_length(0, self.max_model_len):
            return FinishReason.LENGTH
        return None

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.deallocate(seq)

    def abort(self, seq: Sequence) -> None:
        """Remove seq wherever it is; its blocks are free at once."""
        if seq.is_finished:
            return
        queue = self.waiting if seq.status == SequenceStatus.WAITING else self.running
        queue.remove(seq)
        self._end(seq, FinishReason.ABORT)
