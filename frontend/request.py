"""RequestRunner: one request's trip through a worker, between the servicer's validation and its
response messages. Builds the worker request, routes it (frontend.workers.pool), and turns the Session
stream's ids into per-completion fields: detokenized text, stop strings, logprobs, usage.
"""

import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator

import grpc.aio

from nanoserve.errors import Unavailable, worker_status_error
from nanoserve.frontend.admission import Limits, resolve_max_tokens
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.pacing import Pacer
from nanoserve.frontend.request_log import current_record, mark_sent_to_worker
from nanoserve.frontend.text.completion import DETOKENIZE_INLINE_MAX_IDS, CompletionStream
from nanoserve.frontend.text.detokenizer import Detokenizer, IdsOnly
from nanoserve.frontend.text.logprobs import response_logprobs
from nanoserve.frontend.workers.link import WorkerLink
from nanoserve.frontend.workers.pool import WorkerPool
from nanoserve.frontend.workers.session import Pending
from nanoserve.logprob_split import Piece, split_logprobs
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import SamplingParams
from nanoserve.sampling_proto import for_worker
from nanoserve.security import tenant_cache_salt
from nanoserve.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]  # a SessionOutput's error_code


class RequestRunner:
    """Runs the servicer's requests on the pool's workers, one `stream` call per request."""

    def __init__(self, config: FrontendConfig, tokenizer: Tokenizer, pool: WorkerPool) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.pool = pool
        self._worker_ids = itertools.count()
        # Workers may serve several frontends: this process's ids carry a random tag of its own.
        self._id_tag = secrets.token_hex(4)
        self.pacer = Pacer(config.coalesce_max_ids)  # more ids a message while the loop is short

    async def stream(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        limits: Limits,
        context: grpc.aio.ServicerContext,
        prompt_field: str,
        priority: int,
        stream_interval: int,
    ) -> AsyncIterator[dict]:
        """Runs one request on the worker; yields the fields of each response message, each
        tagged with the `index` of its completion (SamplingParams.n). `prompt_field` names the
        request field the prompt came from, for errors; after the first message, one waits for
        `stream_interval` new ids (validation.stream_interval_of: the request's or the frontend's)."""
        max_tokens = resolve_max_tokens(params, len(prompt_ids), limits, prompt_field=prompt_field)
        worker_request = worker_pb2.GenerateTokensRequest(
            # unique in this process (the client's id alone may be reused by another client once
            # it ended here); it keeps the client's id for both services' logs
            request_id=f"{request_id}#{self._id_tag}-{next(self._worker_ids)}",
            prompt_token_ids=prompt_ids,
            sampling_params=for_worker(params, max_tokens),
            # from the authenticated caller, never from the request
            cache_salt=tenant_cache_salt() if self.config.cache_isolation == "tenant" else "",
            priority=priority,
        )
        n = params.n
        # one detokenizer (and stop-string matcher) per completion
        completions = [
            CompletionStream(
                Detokenizer(
                    self.tokenizer.text_stream(params.skip_special_tokens),
                    stop=list(params.stop),
                    include_stop_str_in_output=params.include_stop_str_in_output,
                    min_tokens=params.min_tokens,
                )
                if params.detokenize
                else IdsOnly()
            )
            for _ in range(n)
        ]
        token_texts = self.tokenizer.token_texts if params.detokenize else None
        # Forward the client's remaining deadline so the worker drops the request when it expires.
        timeout = context.time_remaining()
        if timeout is None and self.config.request_timeout_s > 0:
            timeout = self.config.request_timeout_s
        self.pacer.start()
        record = current_record()
        # the call's record while it is traced: the worker's spans become children of its span
        traced = record if record is not None and record.span is not None else None
        if traced is not None:
            worker_request.traceparent = traced.span.traceparent
        link, pending, taken = await self._start(worker_request, prompt_ids, timeout)
        session = link.session
        num_open, completion_tokens, cached_tokens = n, 0, 0
        try:
            while True:
                pending.min_ids = max(stream_interval, self.pacer.min_ids)
                for index, ids, last in taken:
                    c = completions[index]
                    if c.done:
                        continue  # ended by a stop string; the worker's late ids are dropped
                    c.cached_tokens = pending.cached_tokens
                    if last is not None and last.error_code:
                        raise worker_status_error(last.error_code, last.error_message)
                    logprobs, prompt_logprobs = pending.take_logprobs(index)
                    # several messages when the logprob entries are many (a long prompt's, or a
                    # slow client's backlog): each id keeps its logprobs and text in one message
                    pieces = (
                        split_logprobs(
                            ids, logprobs, prompt_logprobs, self.config.max_logprobs_per_message
                        )
                        if logprobs or prompt_logprobs
                        else (Piece(ids, logprobs, prompt_logprobs, True),)
                    )
                    for piece in pieces:
                        if c.done:
                            break  # a stop string matched in an earlier piece
                        piece_last = last if piece.last else None
                        started = time.perf_counter() if traced is not None else 0.0
                        fields = (
                            c.fields_inline(
                                piece.ids,
                                piece_last,
                                params.include_stop_str_in_output,
                                len(prompt_ids),
                            )
                            if len(piece.ids) <= DETOKENIZE_INLINE_MAX_IDS
                            else await c.fields(
                                piece.ids,
                                piece_last,
                                self.tokenizer,
                                params.include_stop_str_in_output,
                                len(prompt_ids),
                            )
                        )
                        if traced is not None:
                            traced.detokenize_s += time.perf_counter() - started
                        if piece.logprobs or piece.prompt_logprobs:
                            fields.update(
                                response_logprobs(
                                    piece.logprobs,
                                    piece.prompt_logprobs,
                                    len(fields["token_ids"]),
                                    token_texts,
                                )
                            )
                        if n > 1:
                            fields["index"] = index
                        if record is not None and fields["token_ids"]:
                            record.add_tokens(len(fields["token_ids"]))
                        if "finish_reason" not in fields:
                            if fields["text"] or fields["token_ids"] or "prompt_logprobs" in fields:
                                yield fields
                            continue
                        c.done = True
                        num_open -= 1
                        if n > 1:  # usage once, on the call's last message: prompt once, all tokens
                            usage = fields.pop("usage")
                            completion_tokens += usage.completion_tokens
                            cached_tokens = max(cached_tokens, usage.cached_tokens)
                            if num_open == 0:
                                fields["usage"] = common_pb2.Usage(
                                    prompt_tokens=len(prompt_ids),
                                    completion_tokens=completion_tokens,
                                    cached_tokens=cached_tokens,
                                )
                        if num_open == 0:
                            session.abort(worker_request.request_id)  # the worker frees its blocks
                        elif last is None or not piece.last:  # a stop string ended it here
                            session.abort_completion(worker_request.request_id, index)
                        yield fields  # request_log.recorded logs the request's end after the last
                        if num_open == 0:
                            return
                taken = await pending.take()
        finally:
            # a no-op once ended; on client cancel or deadline the worker frees the KV blocks
            session.abort(worker_request.request_id)

    async def _start(
        self,
        worker_request: worker_pb2.GenerateTokensRequest,
        prompt_ids: list[int],
        timeout: float | None,
    ) -> tuple[WorkerLink, Pending, list]:
        """Starts the request on the routed worker and takes its first output. A worker that
        refuses it UNAVAILABLE before any output (it began to drain, or its engine stalled, and
        its load report has not reached this frontend yet) is passed over for the next choice
        while one is left: the client has seen nothing yet, so nothing is repeated to it."""
        tried: list[WorkerLink] = []
        link = await self._connected_worker(prompt_ids, tried)
        while True:
            pending = link.start_request(worker_request, timeout)
            mark_sent_to_worker()
            try:
                taken = await pending.take()
            except BaseException:  # cancelled, or the session broke: the worker frees the blocks
                link.session.abort(worker_request.request_id)
                raise
            first = taken[0][2] if taken else None
            if first is None or first.error_code != UNAVAILABLE or any(ids for _, ids, _ in taken):
                return link, pending, taken
            why = f"{worker_request.request_id} ({first.error_message})"
            logger.info("worker %s refused %s: trying another", link.address, why)
            tried.append(link)
            try:
                link = await self._connected_worker(prompt_ids, tried)
            except Unavailable:  # no other worker takes requests: the refusal is the answer
                return link, pending, taken

    async def _connected_worker(self, prompt_ids: list[int], tried: list[WorkerLink]) -> WorkerLink:
        """The routed worker other than those tried, or the next choice when its connection just
        failed (a worker that died since the last poll)."""
        while True:
            link = self.pool.choose(prompt_ids, exclude=tried)  # UNAVAILABLE once none is left
            try:
                await link.check_connected()
                return link
            except Unavailable:
                tried.append(link)
