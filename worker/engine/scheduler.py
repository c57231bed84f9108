"""Continuous batching: picks each step's sequences, chunks long prefills, preempts when KV runs out.

LLMEngine.step calls schedule() -> ModelRunner.run -> postprocess(). Decode-first (vLLM v1): every
running sequence decodes one token, and the token budget left is filled with prompts (new ones,
chunks of long ones, recomputes after preemption) in the same forward, so arrivals never pause the
running streams. A step without prompts is a pure decode step (the runner's CUDA graphs).
"""

from collections import deque

from nanoserve.worker.engine.block_manager import BlockManager, blocks_for
from nanoserve.worker.engine.sequence import FinishReason, Sequence, SequenceStatus


class Scheduler:
    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...],
        block_manager: BlockManager,
    ):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(the step's sequences, decodes first; whether any prompt tokens are in it)."""
        scheduled, preempted = self._schedule_decodes()
        if preempted:  # no admission in a step that ran out of blocks (vLLM)
            return scheduled, False
        prompts = self._schedule_prompts(self.max_num_batched_tokens - len(scheduled))
        return scheduled + prompts, bool(prompts)

    def _schedule_decodes(self) -> tuple[list[Sequence], bool]:
        """One token for each running sequence, preempting the newest when blocks run out;
        (the decodes, whether a sequence was preempted)."""
        scheduled: list[Sequence] = []
        preempted = False
        append_slot = self.block_manager.append_slot
        while self.running:
            seq = self.running.popleft()
            while not append_slot(seq):
                preempted = True
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
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
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table and not self.block_manager.allocate(seq):
                break
            seq.num_scheduled_tokens = min(seq.num_tokens - seq.num_computed_tokens, budget)
            budget -= seq.num_scheduled_tokens
            scheduled.append(seq)
            if not seq.samples_this_step:
                break  # a partial chunk ends the batch; the prompt stays at the head of `waiting`
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        return scheduled

    def decode_follows(self, seqs: list[Sequence]) -> bool:
        """After scheduling decode step `seqs`: whether the next step is predictably a decode of
        (a subset of) them, so that the runner may forward it ahead (worker.engine.lookahead).
        Prompt tokens join the next step (a mixed step) only if a sequence can be admitted: the
        batch has room once those that surely end by length this step are gone, and the head of
        `waiting` fits in the free blocks (its own prefix hits are not counted). An end by eos or a
        stop id is not foreseeable: then a prompt may join after all and the forward ahead is
        discarded."""
        if not self.waiting:
            return True
        ending = [seq for seq in seqs if self._ends_by_length(seq)]
        if len(self.running) - len(ending) >= self.max_num_seqs:
            return True
        head = self.waiting[0]
        if head.block_table:
            return False  # a chunked prefill goes on
        # an upper bound of the blocks free next step: shared blocks of an ending seq may stay held
        free = self.block_manager.num_free_blocks + sum(len(seq.block_table) for seq in ending)
        return blocks_for(head.num_tokens, self.block_manager.block_size) > free

    def _ends_by_length(self, seq: Sequence) -> bool:
        """The token sampled this step surely ends seq (max_tokens or max_model_len)."""
        max_tokens = seq.sampling_params.max_tokens
        return (
            max_tokens is not None and seq.num_completion_tokens + 1 >= max_tokens
        ) or seq.num_tokens + 1 >= self.max_model_len

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks; it is recomputed (prompt + output so far) when blocks are available."""
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> None:
        """Account for the step's work, append the sampled tokens, finish what stopped."""
        num_finished = 0
        for seq, token_id in zip(seqs, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.hash_blocks(seq)
            if seq.num_computed_tokens < len(seq.token_ids):
                continue  # a non-final prefill chunk samples nothing
            assert token_id is not None  # ModelRunner.run samples every row that reached its end
            seq.append_token(token_id)
            reason = self._stop_reason(seq, token_id)
            # structured output: the matcher takes every token; a terminated grammar ends it
            if reason is None and seq.grammar is not None and seq.grammar.accept(token_id):
                reason = FinishReason.STOP
            if reason is not None:
                self._end(seq, reason)
                num_finished += 1
        if num_finished:  # one pass over `running`, not one removal per finished sequence
            self.running = deque(s for s in self.running if not s.is_finished)

    def _stop_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        sp = seq.sampling_params
        num_tokens = len(seq.token_ids)
        num_completion = num_tokens - seq.num_prompt_tokens
        if num_completion >= sp.min_tokens:
            if (
                token_id in self.eos_token_ids and not sp.ignore_eos
            ) or token_id in sp.stop_token_ids:
                seq.stop_token_id = token_id
                return FinishReason.STOP
        if (
            sp.max_tokens is not None and num_completion >= sp.max_tokens
        ) or num_tokens >= self.max_model_len:
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
