"""FrontendServicer: the public FrontendService. Validates, admits, tokenizes, routes each request
to a worker of the pool (frontend.worker_pool), runs it over that worker's Session stream and streams
detokenized text deltas; FrontendServer wires it up with health, reflection and graceful shutdown.
"""

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from nanoserve.frontend.chat_output import ChatOutput, think_open_in_prompt
from nanoserve.frontend.chat_request import chat_inputs
from nanoserve.frontend.completion_stream import CompletionStream
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.detokenizer import Detokenizer
from nanoserve.frontend.logprobs import response_logprobs
from nanoserve.frontend.reasoning_parser import ReasoningParser
from nanoserve.frontend.request_log import RequestLog, RequestSink, mark_sent_to_worker, recorded
from nanoserve.frontend.tokenizer import Tokenizer
from nanoserve.frontend.tool_parser import ToolCallParser
from nanoserve.frontend.validation import (
    Limits,
    resolve_max_tokens,
    validate_prompt_token_ids,
    validate_request_id,
    validate_sampling_params,
    validate_text,
    worker_sampling_params,
)
from nanoserve.frontend.routing import BalanceRule
from nanoserve.frontend.worker_link import WorkerLink
from nanoserve.frontend.worker_pool import WorkerPool
from nanoserve.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    worker_status_error,
    grpc_errors,
)
from nanoserve.grpc_options import server_options
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.security import ServerSecurity, channel_credentials, tenant_cache_salt

if TYPE_CHECKING:  # prometheus_client loads only with a metrics port
    from nanoserve.frontend.metrics import FrontendMetrics

logger = logging.getLogger(__name__)

SERVICE_NAME = frontend_pb2.DESCRIPTOR.services_by_name["FrontendService"].full_name
# A valid request is its prompt (<= max_prompt_bytes) plus at most this much: ids within
# max_model_len, bounded stop lists, parameters. Larger ones are refused before they are parsed.
REQUEST_OVERHEAD_BYTES = 1024 * 1024


class FrontendServicer(frontend_grpc.FrontendServiceServicer):
    def __init__(self, config: FrontendConfig, tokenizer: Tokenizer, pool: WorkerPool) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.pool = pool
        self.num_in_flight = 0
        self.draining = False
        self._live_request_ids: set[str] = set()
        self._worker_ids = itertools.count()
        # Workers may serve several frontends: this process's ids carry a random tag of its own.
        self._id_tag = secrets.token_hex(4)
        self.request_sinks: list[RequestSink] = []  # called with each ended Generate/Chat call

    def _limits(self) -> tuple[Limits, worker_pb2.WorkerServiceGetModelInfoResponse]:
        if self.draining:
            raise Unavailable("frontend is shutting down")
        info = self.pool.model_info()
        return Limits(
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            max_stop_strings=self.config.max_stop_strings,
            max_stop_string_length=self.config.max_stop_string_length,
            max_prompt_bytes=self.config.max_prompt_bytes,
            max_stop_token_ids=self.config.max_stop_token_ids,
            max_chat_messages=self.config.max_chat_messages,
        ), info

    @contextlib.contextmanager
    def _admit(self, request_id: str) -> Iterator[str]:
        """Counts the call in flight, or refuses it past max_concurrent_requests."""
        if self.num_in_flight >= self.config.max_concurrent_requests:
            raise ResourceExhausted(
                f"{self.num_in_flight} requests in flight (max_concurrent_requests); retry later"
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._live_request_ids:
            raise AlreadyExists(f"request_id {request_id!r} is already in flight")
        self.num_in_flight += 1
        self._live_request_ids.add(request_id)
        try:
            yield request_id
        finally:
            self.num_in_flight -= 1
            self._live_request_ids.discard(request_id)

    @recorded
    @grpc_errors
    async def Generate(
        self, request: frontend_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[frontend_pb2.GenerateResponse]:
        """Streams the completion of a raw prompt (text or token ids)."""
        limits, _ = self._limits()
        validate_request_id(request.request_id)
        if request.prompt and request.prompt_token_ids:
            raise InvalidArgument("set exactly one of prompt and prompt_token_ids", field="prompt")
        if request.prompt_token_ids:
            validate_prompt_token_ids(request.prompt_token_ids, limits, "prompt_token_ids")
        else:
            validate_text(request.prompt, limits, "prompt")
        validate_sampling_params(request.sampling_params, limits)
        with self._admit(request.request_id) as request_id:
            if request.prompt_token_ids:
                prompt_ids = list(request.prompt_token_ids)
            else:
                add_special = (
                    not request.HasField("add_special_tokens") or request.add_special_tokens
                )
                prompt_ids = await self.tokenizer.encode_async(request.prompt, add_special)
                validate_prompt_token_ids(prompt_ids, limits, "prompt")
            prompt_field = "prompt_token_ids" if request.prompt_token_ids else "prompt"
            async for fields in self._stream(
                request_id,
                prompt_ids,
                request.sampling_params,
                limits,
                context,
                prompt_field,
                request.priority,
            ):
                yield frontend_pb2.GenerateResponse(**fields)

    @recorded
    @grpc_errors
    async def Chat(
        self, request: frontend_pb2.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[frontend_pb2.ChatResponse]:
        """Applies the chat template to the messages and streams the reply."""
        limits, _ = self._limits()
        validate_request_id(request.request_id)
        inputs = chat_inputs(request, limits)  # messages counted before any is read
        validate_sampling_params(request.sampling_params, limits)
        if not self.tokenizer.has_chat_template:
            raise FailedPrecondition("the model's tokenizer_config.json has no chat template")
        enable_thinking = not request.HasField("enable_thinking") or request.enable_thinking
        with self._admit(request.request_id) as request_id:
            prompt_ids = await self.tokenizer.encode_chat_async(
                inputs.messages, enable_thinking, inputs.tools, inputs.size
            )
            validate_prompt_token_ids(prompt_ids, limits, "messages")
            think_open = think_open_in_prompt(prompt_ids, self.tokenizer.token_to_id)
            outputs: dict[int, ChatOutput] = {}  # one parser state per completion (n > 1)

            def output(index: int) -> ChatOutput:
                if index not in outputs:
                    outputs[index] = ChatOutput(
                        ReasoningParser(think_open) if request.separate_reasoning else None,
                        ToolCallParser() if inputs.parse_tool_calls else None,
                    )
                return outputs[index]

            async for fields in self._stream(
                request_id,
                prompt_ids,
                request.sampling_params,
                limits,
                context,
                "messages",
                request.priority,
            ):
                yield frontend_pb2.ChatResponse(**output(fields.get("index", 0)).update(fields))

    @grpc_errors
    async def Tokenize(
        self, request: frontend_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.TokenizeResponse:
        """Returns the token ids of a text; needs no worker."""
        if len(request.text.encode("utf-8")) > self.config.max_prompt_bytes:
            raise InvalidArgument(
                f"longer than max_prompt_bytes ({self.config.max_prompt_bytes})", field="text"
            )
        add_special = not request.HasField("add_special_tokens") or request.add_special_tokens
        with self._admit(""):  # a Tokenize call holds a tokenizer thread like a Generate call
            token_ids = await self.tokenizer.encode_async(request.text, add_special)
        return frontend_pb2.TokenizeResponse(token_ids=token_ids)

    @grpc_errors
    async def GetModelInfo(
        self, request: frontend_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.GetModelInfoResponse:
        """Returns the model's name and limits as the worker reported them."""
        _, info = self._limits()
        return frontend_pb2.GetModelInfoResponse(
            model_name=info.model_name,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            eos_token_ids=info.eos_token_ids,
            tensor_parallel_size=info.tensor_parallel_size,
            has_chat_template=self.tokenizer.has_chat_template,
        )

    async def _stream(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: common_pb2.SamplingParams,
        limits: Limits,
        context: grpc.aio.ServicerContext,
        prompt_field: str,
        priority: int = 0,
    ) -> AsyncIterator[dict]:
        """Runs one request on the worker; yields the fields of each response message, each
        tagged with the `index` of its completion (SamplingParams.n). `prompt_field` names the
        request field the prompt came from, for errors."""
        max_tokens = resolve_max_tokens(params, len(prompt_ids), limits, prompt_field=prompt_field)
        worker_request = worker_pb2.GenerateTokensRequest(
            # unique in this process (the client's id alone may be reused by another client once
            # it ended here); it keeps the client's id for both services' logs
            request_id=f"{request_id}#{self._id_tag}-{next(self._worker_ids)}",
            prompt_token_ids=prompt_ids,
            sampling_params=worker_sampling_params(params, max_tokens),
            # from the authenticated caller, never from the request
            cache_salt=tenant_cache_salt() if self.config.cache_isolation == "tenant" else "",
            priority=priority,
        )
        skip_special = not params.HasField("skip_special_tokens") or params.skip_special_tokens
        include_stop = params.include_stop_str_in_output
        n = params.n if params.HasField("n") else 1
        # one detokenizer (and stop-string matcher) per completion
        completions = [
            CompletionStream(
                Detokenizer(
                    functools.partial(self.tokenizer.decode, skip_special_tokens=skip_special),
                    stop=list(params.stop),
                    include_stop_str_in_output=include_stop,
                    min_tokens=params.min_tokens,
                )
            )
            for _ in range(n)
        ]
        # Forward the client's remaining deadline so the worker drops the request when it expires.
        timeout = context.time_remaining()
        if timeout is None and self.config.request_timeout_s > 0:
            timeout = self.config.request_timeout_s
        link = await self._connected_worker(prompt_ids)
        session = link.session
        pending = link.start_request(worker_request, timeout)
        mark_sent_to_worker()
        num_open, completion_tokens, cached_tokens = n, 0, 0
        try:
            while True:
                taken = await pending.take()
                pending.min_ids = self.config.stream_interval
                for index, ids, last in taken:
                    c = completions[index]
                    if c.done:
                        continue  # ended by a stop string; the worker's late ids are dropped
                    if last is not None and last.error_code:
                        raise worker_status_error(last.error_code, last.error_message)
                    fields = await c.fields(
                        ids, last, self.tokenizer, include_stop, len(prompt_ids)
                    )
                    logprobs, prompt_logprobs = pending.take_logprobs(index)
                    if logprobs or prompt_logprobs:
                        fields.update(
                            response_logprobs(
                                logprobs,
                                prompt_logprobs,
                                len(fields["token_ids"]),
                                self.tokenizer.token_texts,
                            )
                        )
                    if n > 1:
                        fields["index"] = index
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
                        session.abort(worker_request.request_id)  # the worker frees its KV blocks
                    yield fields  # request_log.recorded logs the request's end after the last
                    if num_open == 0:
                        return
        finally:
            # a no-op once ended; on client cancel or deadline the worker frees the KV blocks
            session.abort(worker_request.request_id)

    async def _connected_worker(self, prompt_ids: list[int]) -> WorkerLink:
        """The routed worker, or the next choice when its connection just failed (a worker that
        died since the last poll)."""
        tried: list[WorkerLink] = []
        while True:
            link = self.pool.choose(prompt_ids, exclude=tried)  # UNAVAILABLE once none is left
            try:
                await link.check_connected()
                return link
            except Unavailable:
                tried.append(link)


class FrontendServer:
    """The frontend's grpc.aio server: FrontendService, health, reflection, and the worker link."""

    def __init__(self, config: FrontendConfig, model_dir: str, tokenizer: Tokenizer | None = None):
        self.config = config
        self._owns_tokenizer = tokenizer is None
        self.tokenizer = tokenizer or Tokenizer(model_dir, config.tokenizer_threads)
        self.health = health_aio.HealthServicer()
        self.pool = WorkerPool(
            config.worker_address,
            tokenizer_digest(model_dir),
            self._on_worker_ready,
            connect_timeout_s=config.worker_connect_timeout_s,
            max_message_bytes=config.max_message_bytes,
            resolve_interval_s=config.worker_resolve_interval_s,
            poll_interval_s=config.worker_poll_interval_s,
            prefix_tokens=config.route_prefix_tokens,
            rule=BalanceRule(config.route_max_queue_gap, config.route_max_queue_ratio),
            credentials=channel_credentials(
                config.worker_tls_ca_file,
                config.worker_tls_client_cert_file,
                config.worker_tls_client_key_file,
            ),
        )
        self.servicer = FrontendServicer(config, self.tokenizer, self.pool)
        self.servicer.request_sinks.append(RequestLog(config.log_format))
        self.metrics: FrontendMetrics | None = None
        self.metrics_server: Any = None  # prometheus_client's HTTP server, when metrics_port is set
        if config.metrics_port:  # prometheus_client is imported (and paid for) only when asked for
            from nanoserve.frontend.metrics import FrontendMetrics

            self.metrics = FrontendMetrics(Path(model_dir).name)
            self.metrics.track_in_flight(lambda: self.servicer.num_in_flight)
            self.servicer.request_sinks.append(self.metrics.observe)
        self.security = ServerSecurity.load(
            config.tls_cert_file,
            config.tls_key_file,
            config.tls_client_ca_file,
            config.api_keys_file,
            config.api_keys,
        )
        options = server_options(config.max_message_bytes)
        if config.reuse_port:  # several frontend processes on one port
            options = [o for o in options if o[0] != "grpc.so_reuseport"] + [
                ("grpc.so_reuseport", 1)
            ]
        self.server = grpc.aio.server(
            interceptors=self.security.interceptors(
                config.max_prompt_bytes + REQUEST_OVERHEAD_BYTES, "max_prompt_bytes + 1 MiB"
            ),
            options=options,
        )
        frontend_grpc.add_FrontendServiceServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if config.enable_reflection:
            reflection.enable_server_reflection(
                [
                    SERVICE_NAME,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ],
                self.server,
            )
        self.port: int | None = None

    async def _on_worker_ready(self, ready: bool) -> None:
        """Health follows the pool: SERVING while some worker takes requests (not draining)."""
        if self.servicer.draining:  # the frontend itself is stopping: stays NOT_SERVING
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def start(self) -> int:
        """Binds and starts serving (NOT_SERVING until the worker answers); returns the port."""
        await self._on_worker_ready(False)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        self.port = self.security.add_port(self.server, self.config.host, self.config.port)
        if self.port == 0:
            raise RuntimeError(f"could not bind {host}:{self.config.port}")
        await self.server.start()
        if self.config.metrics_port and self.metrics is not None:
            from nanoserve.metrics_endpoint import serve_metrics

            self.metrics_server = serve_metrics(
                self.metrics.registry, self.config.metrics_port, self.config.host
            )
        self.pool.start()
        logger.info("frontend listening on %s:%d", host, self.port)
        return self.port

    async def stop(self, grace: float = 0.0) -> None:
        """Drains: NOT_SERVING at once, new Generate/Chat calls refused (UNAVAILABLE), calls in
        flight get `grace` seconds to finish, then the server stops and cuts what is left."""
        self.servicer.draining = True
        await self.health.enter_graceful_shutdown()
        # Keep answering health checks (NOT_SERVING) while streams finish; server.stop() would
        # refuse them, and would wait out the whole grace period for open health Watch streams.
        deadline = time.monotonic() + grace
        while self.servicer.num_in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.server.stop(min(1.0, max(0.0, deadline - time.monotonic())))
        await self.pool.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        if self._owns_tokenizer:
            self.tokenizer.close()
