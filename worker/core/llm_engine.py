"""The engine: checked requests into Sequences, and steps scheduler -> model runner -> postprocess.

Used directly by the offline LLM API and, from one engine thread, by the gRPC worker (worker.service.server).
Token ids only: the worker never sees text.
"""

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanoserve.sampling import Limits, SamplingParams
from nanoserve.worker.config import EngineConfig
from nanoserve.worker.core.block_manager import BlockManager
from nanoserve.worker.core.scheduler import Scheduler
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.sequence import FinishReason, NextStep, Sequence, SequenceStatus

if TYPE_CHECKING:  # imported where chosen: a single-GPU engine needs no tensor-parallel machinery
    from nanoserve.worker.core.grammars import Grammars
    from nanoserve.worker.runner.model_runner import ModelRunner
    from nanoserve.worker.tp.runner import TensorParallelRunner

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one request."""

    seq: Sequence
    new_token_ids: list[int]
    finished: bool
    # entries [token_id, logprob, rank, top_ids, top_logprobs] (worker.runner.logprobs), one per
    # new token / new prompt position; None when the request did not ask
    logprobs: list[list] | None = None
    prompt_logprobs: list[list] | None = None


class LLMEngine:
    model_runner: "ModelRunner | TensorParallelRunner"

    def __init__(self, config: EngineConfig):
        if not config.model:
            raise ValueError("model: a model directory is required")
        self.config = config
        self.model_config = ModelConfig.from_model_dir(config.model)
        if config.tensor_parallel_size > 1:
            from nanoserve.worker.tp.runner import TensorParallelRunner

            self.model_runner = TensorParallelRunner(config, self.model_config)
        else:
            from nanoserve.worker.runner.model_runner import ModelRunner

            self.model_runner = ModelRunner(config, self.model_config)
        runner = self.model_runner
        self.block_size = config.kvcache_block_size
        self.num_kvcache_blocks = runner.num_kvcache_blocks
        self.max_model_len = self._resolve_max_model_len(runner.max_model_len)
        self.eos_token_ids = tuple(self.model_config.eos_token_ids)
        self.sampling_defaults = dict(self.model_config.sampling_defaults)
        self.block_manager = BlockManager(self.num_kvcache_blocks, self.block_size)
        self.scheduler = Scheduler(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.max_model_len,
            self.eos_token_ids,
            self.block_manager,
            config.max_prefill_tokens_while_decoding,
        )
        self.requests: dict[str | int, Sequence] = {}
        self._grammars: Grammars | None = None  # made by the first structured-output request
        self.num_prompt_tokens_done = 0
        self.num_generated_tokens = 0
        # the step forwarded ahead (if one is) was decided while prompts waited
        self.ahead_over_waiting = False
        self.lookahead_prompts = config.plans_prompts_ahead()  # (bench arrivals sets it per run)

    def _resolve_max_model_len(self, model_len: int) -> int:
        """The runner's length (--max-model-len, else max_position_embeddings) lowered to the KV
        cache's capacity: one sequence must fit in the cache whole."""
        capacity = self.num_kvcache_blocks * self.block_size
        resolved = min(model_len, capacity)
        if self.config.max_model_len:
            if resolved < model_len:
                logger.warning(
                    "max_model_len lowered from %d to %d: the KV cache holds %d tokens",
                    model_len,
                    resolved,
                    capacity,
                )
        elif resolved < model_len:
            logger.info(
                "max_model_len %d: the model's max_position_embeddings (%d) lowered to "
                "what the KV cache holds",
                resolved,
                model_len,
            )
        else:
            logger.info("max_model_len %d: the model's max_position_embeddings", resolved)
        return resolved

    @property
    def limits(self) -> Limits:
        """What requests are checked against: this engine's model and batch bounds."""
        return Limits(
            max_model_len=self.max_model_len,
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=tuple(self.eos_token_ids),
            max_num_seqs=self.config.max_num_seqs,
        )

    def add_request(
        self,
        token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | int | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> Sequence:
        """Queues a request (its first Sequence; with n > 1 the others join seq.group once it is
        prefilled). With `cache_salt`, it shares prefix-cache blocks only with requests of the same
        salt (block_manager.salt_hash); priority: lower is served first. The request was checked
        at its door (LLM.add_request, request_proto.admit)."""
        # fields the caller left unset take the model's generation_config.json defaults (vLLM)
        sp = sampling_params.with_defaults(self.sampling_defaults)
        seq = Sequence(token_ids, sp, request_id, cache_salt, priority)
        if seq.request_id in self.requests:
            raise ValueError(f"request_id: {seq.request_id!r} is already running")
        self.requests[seq.request_id] = seq
        if sampling_params.structured_output is not None:
            self.grammars.submit(seq)  # scheduled once its grammar is compiled (step)
        else:
            self.scheduler.add(seq)
        return seq

    @property
    def grammars(self) -> "Grammars":
        """Structured output's compiler and the sequences waiting for it (made on first use:
        xgrammar is imported only by an engine that serves a constrained request)."""
        if self._grammars is None:
            from nanoserve.worker.core.grammars import Grammars

            mc = self.model_config
            self._grammars = Grammars(self.config.model, mc.vocab_size, self.eos_token_ids)
        return self._grammars

    @property
    def num_compiling(self) -> int:
        """Requests waiting for their grammar's compile (not yet in the scheduler)."""
        return len(self._grammars.waiting) if self._grammars is not None else 0

    def _admit_compiled(self) -> list[StepOutput]:
        """Schedule the sequences whose grammar compiled; end (with seq.error) those whose
        grammar does not compile."""
        if self._grammars is None or not self._grammars.waiting:
            return []
        ready, failed = self._grammars.take_ready()
        for seq in ready:
            self.scheduler.add(seq)
        for seq, error in failed:
            seq.status, seq.finish_reason, seq.error = (
                SequenceStatus.FINISHED,
                FinishReason.ABORT,
                error,
            )
            self.requests.pop(seq.request_id, None)
        return [StepOutput(seq, [], True) for seq, _ in failed]

    def abort(self, request_id: str | int) -> bool:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        for s in seq.group or (seq,):  # all n completions
            if self._grammars is not None and self._grammars.abort(s):  # still compiling
                s.status, s.finish_reason = SequenceStatus.FINISHED, FinishReason.ABORT
                continue
            self.scheduler.abort(s)
            self.model_runner.release(s)
        return True

    def abort_completion(self, request_id: str | int, index: int) -> bool:
        """Ends completion `index` of an n > 1 request (its caller matched a stop string in it):
        its blocks are freed, those it shares stay with the others, which continue. A completion
        not forked yet (the parent still prefills) ends when it is. With n = 1, the request ends.
        False when the request or that completion is unknown or already ended."""
        seq = self.requests.get(request_id)
        if seq is None or not 0 <= index < seq.sampling_params.n:
            return False
        group = seq.group
        if group is None:
            return self.abort(request_id)
        if len(group) < seq.sampling_params.n:  # not forked yet: `seq` is the parent
            if index in seq.aborted_indices:
                return False
            seq.aborted_indices.add(index)
            if len(seq.aborted_indices) == seq.sampling_params.n:  # nothing left to run
                return self.abort(request_id)
            return True
        target = next(s for s in group if s.index == index)
        if target.is_finished:
            return False
        self.scheduler.abort(target)  # forks exist: its grammar (if any) compiled long ago
        self.model_runner.release(target)
        if all(s.is_finished for s in group):
            self.requests.pop(request_id, None)
        return True

    def step(self) -> list[StepOutput]:
        refused = self._admit_compiled()
        # a decode step forwarded ahead is taken as it is, and prompts that arrived since it was
        # decided join the step after: admitted now, they would drop that forward (the GPU time of
        # a whole decode step) and the running streams would wait for both it and the mixed step.
        # Prompts that waited already were judged not to fit (decode_follows, which counts no
        # prefix hits): they are tried now, as ever. Nothing running (the forward's sequences all
        # ended, by a stop token or an abort): nothing would take it, so no deferral.
        ahead = self.model_runner.holds_foreseen
        if not ahead:
            self.scheduler.planned = None  # nothing was forwarded ahead: no plan binds this step
        defer = (
            ahead
            and self.scheduler.planned is None
            and not self.ahead_over_waiting
            and bool(self.scheduler.running)
        )
        seqs, is_prefill = self.scheduler.schedule(admit=not defer)
        copies = self.block_manager.take_copies()
        if not seqs:
            if not refused and self._grammars is not None and self._grammars.waiting:
                self._grammars.wait(0.005)  # only compiles left: do not spin
            return refused
        # the next step predictably decodes the same sequences again (no admission is possible):
        # the runner may forward it ahead (worker.runner.lookahead) into slots reserved now
        lookahead = (
            not is_prefill
            and self.model_runner.uses_lookahead
            and self.scheduler.decode_follows(seqs)
        )
        if lookahead:
            self.ahead_over_waiting = bool(self.scheduler.waiting)
            for seq in seqs:
                if seq.num_tokens + 1 < self.max_model_len:
                    self.block_manager.reserve_next(seq)
        plan: Callable[[], NextStep | None] | None = None
        if not lookahead and self.lookahead_prompts and self.model_runner.uses_lookahead:
            # a step with prompts next, or after this prefill: scheduled by the runner once this
            # step's forward is launched (the GPU computes meanwhile), and forwarded ahead too
            plan = functools.partial(self.scheduler.plan_next, seqs)
        if copies:  # copy-on-write of blocks shared by n > 1 completions, before they are written
            self.model_runner.copy_blocks(copies)
        token_ids = self.model_runner.run(seqs, is_prefill, lookahead=lookahead, plan=plan)
        if is_prefill:  # a mixed step: the decodes (first, one token each) are no prompt tokens
            self.num_prompt_tokens_done += sum(
                s.num_scheduled_tokens
                for s in seqs
                if s.num_computed_tokens < s.num_prompt_tokens or s.num_scheduled_tokens > 1
            )
        # a row the grammar and allowed_token_ids left without a token (SamplingInputs set
        # seq.error): its draw is dropped and its request ends, every completion of it
        ended = [seq for seq in seqs if seq.error is not None]
        if ended:
            kept = [(seq, t) for seq, t in zip(seqs, token_ids) if seq.error is None]
            seqs, token_ids = [seq for seq, _ in kept], [t for _, t in kept]
        self.scheduler.postprocess(seqs, token_ids)
        for seq in ended:
            self.abort(seq.request_id)
        outputs = refused + [StepOutput(seq, [], True) for seq in ended]
        for seq in seqs:
            new = seq.take_new_tokens()
            done = seq.is_finished
            if done:
                if seq.group is None or all(s.is_finished for s in seq.group):
                    self.requests.pop(seq.request_id, None)
                self.model_runner.release(seq)
            logprobs = prompt_logprobs = None
            if seq.new_logprobs or seq.new_prompt_logprobs:  # only requests that asked
                logprobs, prompt_logprobs = seq.take_new_logprobs()
            if new or done or prompt_logprobs:
                self.num_generated_tokens += len(new)
                outputs.append(StepOutput(seq, new, done, logprobs, prompt_logprobs))
        return outputs

    def is_finished(self) -> bool:
        return self.scheduler.is_finished() and not (self._grammars and self._grammars.waiting)

    def shutdown(self) -> None:
        if self._grammars is not None:
            self._grammars.close()
        self.model_runner.close()
