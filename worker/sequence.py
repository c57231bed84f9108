"""One request inside the engine: its token ids, KV block table and progress through prefill/decode.

Created by LLMEngine.add_request, moved between queues by the Scheduler, read by the ModelRunner;
a NextStep is the step after this one as the Scheduler plans it, for the runner to forward ahead.
"""

import time
from dataclasses import dataclass
from enum import Enum, auto
from itertools import count
from typing import Any, Protocol

from nanoserve.sampling import SamplingParams


class TokenGrammar(Protocol):
    """A sequence's structured-output matcher (worker.core.grammars.Grammar)."""

    def accept(self, token_id: int) -> bool: ...  # True: the output is complete

    def fill(self, bitmask: Any, row: int) -> None: ...  # the allowed next tokens into a row

    def fresh(self) -> "TokenGrammar": ...  # the same grammar at its start (a fork's)


class SequenceStatus(Enum):
    # not prefilled yet (or preempted); may hold blocks while a chunked prefill runs
    WAITING = auto()
    RUNNING = auto()  # prefilled, decoding
    FINISHED = auto()


class FinishReason(Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # cancelled by the caller


class Sequence:
    _counter = count()

    def __init__(
        self,
        token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | int | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ):
        self.seq_id = next(Sequence._counter)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        # prefix-cache isolation: only sequences with the same salt share cached blocks
        self.cache_salt = cache_salt or None
        self.priority = priority  # lower is served first (vLLM's priority policy)
        self.arrival = self.seq_id  # the request's arrival order; a fork keeps its parent's
        self.index = 0  # which of the request's n completions this is
        # n > 1: every Sequence of the request (the parent first, then its forks), one shared list
        self.group: list[Sequence] | None = [self] if sampling_params.n > 1 else None
        # n > 1, on the parent before it forks: completions aborted already (LLMEngine.
        # abort_completion); the fork ends them at once
        self.aborted_indices: set[int] = set()
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.sampling_params = sampling_params
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the full blocks computed so far
        self.num_computed_tokens = 0  # tokens whose KV is in the cache (prefix hits included)
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (for usage)
        self.num_scheduled_tokens = 0  # tokens the current step computes
        self.finish_reason: FinishReason | None = None
        self.stop_token_id: int | None = None
        self.num_emitted = 0  # completion tokens already handed to the caller
        # time.monotonic() marks for the queue / prefill / decode time histograms (worker.service.metrics)
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None  # its first prompt chunk was scheduled
        self.first_token_time: float | None = None  # its first completion token was sampled
        self.finished_time: float | None = None
        # logprobs (worker.runner.logprobs): entries made by the runner, not yet handed out, and
        # the prompt positions done (1..n: a recompute after preemption does not redo them)
        self.new_logprobs: list[list] = []
        self.new_prompt_logprobs: list[list] = []
        self.num_prompt_logprobs = 0
        # structured output: the matcher once compiled (worker.core.grammars); the
        # reason the request was refused after admission (its grammar does not compile)
        self.grammar: TokenGrammar | None = None
        self.error: str | None = None

    @property
    def sched_key(self) -> tuple[int, int, int]:
        """Admission order: priority, then arrival, then completion index; the largest key is
        preempted first."""
        return self.priority, self.arrival, self.index

    @property
    def num_seats(self) -> int:
        """Batch slots this sequence takes once running: a parent not forked yet brings n."""
        return 1 if self.group is None else self.sampling_params.n - len(self.group) + 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def reaches_length(self, more: int, max_model_len: int) -> bool:
        """With `more` tokens appended, it ends by length (max_tokens or max_model_len)."""
        max_tokens = self.sampling_params.max_tokens
        num_tokens = len(self.token_ids) + more
        return (
            max_tokens is not None and num_tokens - self.num_prompt_tokens >= max_tokens
        ) or num_tokens >= max_model_len

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def samples_this_step(self) -> bool:
        """The scheduled tokens reach the end of the sequence: this step yields its next token
        (False for a chunk in the middle of a long prompt)."""
        return self.num_computed_tokens + self.num_scheduled_tokens == len(self.token_ids)

    def block_token_ids(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size : (i + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def timings(self) -> tuple[float, float, float]:
        """(queue, prefill, decode) seconds of a finished sequence: arrival -> first scheduled ->
        first token -> finish (vLLM's request phases; a preempted sequence keeps its first
        marks)."""
        scheduled = self.first_scheduled_time or self.arrival_time
        first_token = self.first_token_time or scheduled
        end = self.finished_time or first_token
        return scheduled - self.arrival_time, first_token - scheduled, end - first_token

    def fork(self, index: int, sampling_params: SamplingParams) -> "Sequence":
        """Completion `index` of a prefilled parent: the parent's prompt, with its last token still
        to compute so that the child's first decode step samples its own first token
        (BlockManager.fork shares the parent's blocks with it)."""
        assert self.group is not None and self.num_completion_tokens == 1
        child = Sequence(
            self.token_ids[: self.num_prompt_tokens],
            sampling_params,
            self.request_id,
            self.cache_salt,
        )
        child.priority, child.arrival, child.index = self.priority, self.arrival, index
        child.arrival_time, child.first_scheduled_time = (
            self.arrival_time,
            self.first_scheduled_time,
        )
        child.group = self.group
        child.grammar = self.grammar.fresh() if self.grammar is not None else None
        self.group.append(child)
        child.num_computed_tokens = self.num_prompt_tokens - 1
        child.num_cached_tokens = self.num_cached_tokens
        # the parent computed the prompt's logprobs: a preempted child recomputes its KV, not
        # them (nor does it refuse prefix-cache hits for them)
        child.num_prompt_logprobs = self.num_prompt_logprobs
        child.status = SequenceStatus.RUNNING
        return child

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs that are not all computed yet: no prefix-cache hits."""
        return (
            self.sampling_params.prompt_logprobs is not None
            and self.num_prompt_logprobs < self.num_prompt_tokens - 1
        )

    def take_new_logprobs(self) -> tuple[list[list] | None, list[list] | None]:
        """(output, prompt) logprob entries not yet handed out; None where not asked for."""
        sp = self.sampling_params
        out = prompt = None
        if sp.logprobs is not None:
            out, self.new_logprobs = self.new_logprobs, []
        if sp.prompt_logprobs is not None and self.new_prompt_logprobs:
            prompt, self.new_prompt_logprobs = self.new_prompt_logprobs, []
        return out, prompt

    def take_new_tokens(self) -> list[int]:
        """Completion tokens not yet handed to the caller."""
        new = self.token_ids[self.num_prompt_tokens + self.num_emitted :]
        self.num_emitted += len(new)
        return new


@dataclass(slots=True)
class NextStep:
    """The step after this one, scheduled before this one's ids are known (Scheduler.plan_next):
    `decodes` sample this step and go on (one token each, its id this step's sample), then the
    `prompts` (sequence, first token, tokens) chunks, their blocks allocated already."""

    decodes: list[Sequence]
    prompts: list[tuple[Sequence, int, int]]

    @property
    def seqs(self) -> list[Sequence]:
        return self.decodes + [seq for seq, _, _ in self.prompts]
