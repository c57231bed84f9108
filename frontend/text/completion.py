"""One completion of a Generate/Chat call as the frontend streams it: the worker's new ids ->
incremental detokenization and stop strings -> the fields of the next response message. A call
with SamplingParams.n > 1 has one per completion (FrontendServicer._stream); one with
`detokenize` false streams ids only (detokenizer.IdsOnly).
"""

from dataclasses import dataclass
from typing import Any

from nanoserve.frontend.text.detokenizer import Detokenizer, DetokenizerOutput, IdsOnly
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.text.tokenizer import Tokenizer

# Batches of more ids than this (a slow client let the worker's messages pile up) are detokenized in
# the tokenizer's thread pool so the event loop keeps serving other streams.
DETOKENIZE_INLINE_MAX_IDS = 64


@dataclass(slots=True)
class CompletionStream:
    detokenizer: Detokenizer | IdsOnly
    completion_tokens: int = 0  # tokens streamed so far
    cached_tokens: int = 0  # the worker's figure, for a usage built here (a stop string ended it)
    done: bool = False  # ended (by the worker, or by a stop string matched here)

    async def fields(
        self,
        ids: list[int],
        last: worker_pb2.SessionOutput | None,
        tokenizer: Tokenizer,
        include_stop: bool,
        prompt_len: int,
    ) -> dict[str, Any]:
        """New ids (and the worker's last output once it ended) -> the fields of the next message;
        with finish_reason and usage when the completion ended (at the worker, or by a stop
        string matched here). Long batches are detokenized in the tokenizer's thread pool."""
        skip_last = self._skip_last(ids, last, include_stop)
        out = await tokenizer.run(self.detokenizer.add, ids, skip_last)
        return self._fields(out, ids, last, prompt_len)

    def fields_inline(
        self,
        ids: list[int],
        last: worker_pb2.SessionOutput | None,
        include_stop: bool,
        prompt_len: int,
    ) -> dict[str, Any]:
        """`fields` on the event loop, for at most DETOKENIZE_INLINE_MAX_IDS ids: the common case
        (one step's id) without a coroutine or a thread hop."""
        out = self.detokenizer.add(ids, self._skip_last(ids, last, include_stop))
        return self._fields(out, ids, last, prompt_len)

    @staticmethod
    def _skip_last(
        ids: list[int], last: worker_pb2.SessionOutput | None, include_stop: bool
    ) -> bool:
        # A stop token's text stays out of the output, like a stop string's (vLLM).
        return (
            last is not None
            and not include_stop
            and len(ids) > 0
            and last.HasField("stop_token_id")
            and ids[-1] == last.stop_token_id
        )

    def _fields(
        self,
        out: DetokenizerOutput,
        ids: list[int],
        last: worker_pb2.SessionOutput | None,
        prompt_len: int,
    ) -> dict[str, Any]:
        self.completion_tokens += out.num_tokens
        fields: dict[str, Any] = {"text": out.text, "token_ids": ids[: out.num_tokens]}
        if out.matched_stop is None and last is not None:
            tail = self.detokenizer.flush()
            fields["text"] += tail.text
            out.matched_stop = tail.matched_stop
            if tail.matched_stop is None:
                fields.update(finish_reason=last.finish_reason, usage=last.usage)
                if last.HasField("stop_token_id"):
                    fields["matched_stop_token_id"] = last.stop_token_id
        if out.matched_stop is not None:
            fields.update(
                finish_reason=common_pb2.FINISH_REASON_STOP,
                matched_stop=out.matched_stop,
                usage=common_pb2.Usage(
                    prompt_tokens=prompt_len,
                    completion_tokens=self.completion_tokens,
                    cached_tokens=self.cached_tokens,  # the worker sent it with the first ids
                ),
            )
        return fields
