"""One request inside the engine: its token ids, KV block table and progress through prefill/decode.

Created by LLMEngine.add_request, moved between queues by the Scheduler, read by the ModelRunner.
"""

from enum import Enum, auto
from itertools import count
from typing import Any, Protocol

from nanoserve.worker.sampling_params import SamplingParams


class TokenGrammar(Protocol):
    """A sequence's structured-output matcher (worker.engine.structured_output.Grammar)."""

    def accept(self, token_id: int) -> bool: ...  # True: the output is complete

    def fill(self, bitmask: Any, row: int) -> None: ...  # the allowed next tokens into a row


class SequenceStatus(Enum):
    WAITING = (
        auto()
    )  # not prefilled yet (or preempted); may hold blocks while a chunked prefill runs
    RUNNING = auto()  # prefilled, decoding
    FINISHED = auto()


class FinishReason(Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # cancelled by the caller


class Sequence:
    _counter = count()

    def __init__(
        self, token_ids: list[int], sampling_params: SamplingParams, request_id: str | None = None
    ):
        self.seq_id = next(Sequence._counter)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
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
        # structured output: the matcher once compiled (worker.engine.structured_output); the
        # reason the request was refused after admission (its grammar does not compile)
        self.grammar: TokenGrammar | None = None
        self.error: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

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

    def take_new_tokens(self) -> list[int]:
        """Completion tokens not yet handed to the caller."""
        new = self.token_ids[self.num_prompt_tokens + self.num_emitted :]
        self.num_emitted += len(new)
        return new
