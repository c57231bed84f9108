"""FrontendServicer: the public FrontendService's RPCs. Validates and admits each call, tokenizes its
prompt (or chat messages), and hands it to frontend.request, which runs it on a worker; the
chat output parsers split reasoning and tool calls from the streamed text.
"""

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import grpc.aio

from nanoserve.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    grpc_errors,
)
from nanoserve.frontend.admission import (
    Limits,
    stream_interval_of,
    validate_prompt_token_ids,
    validate_request_id,
    validate_sampling_params,
    validate_text,
)
from nanoserve.frontend.chat.inputs import chat_inputs
from nanoserve.frontend.chat.output import ChatOutput, think_in_prompt
from nanoserve.frontend.chat.reasoning import ReasoningParser
from nanoserve.frontend.chat.tool_choice import constrained_params
from nanoserve.frontend.chat.tool_parser import ToolCallParser
from nanoserve.frontend.config import FrontendConfig
from nanoserve.frontend.request import RequestRunner
from nanoserve.frontend.request_log import RequestSink, mark_tokenized, recorded
from nanoserve.frontend.workers.pool import WorkerPool
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.security import current_tenant
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.tracing import Tracer

# The field the worker names when a forced tool choice's constraint does not compile.
FORCED_TAG_FIELD = "sampling_params.structured_output.structural_tag"


class FrontendServicer(frontend_grpc.FrontendServiceServicer):
    def __init__(self, config: FrontendConfig, tokenizer: Tokenizer, pool: WorkerPool) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.pool = pool
        self.num_in_flight = 0
        self.draining = False
        # (tenant, request id): ids are the caller's, so one tenant's never collide with, reveal or
        # block another's; within a tenant an id in flight is refused (ALREADY_EXISTS)
        self._live_request_ids: set[tuple[str | None, str]] = set()
        self.requests = RequestRunner(config, tokenizer, pool)
        self.request_sinks: list[RequestSink] = []  # called with each ended Generate/Chat call
        self.tracer: Tracer | None = None  # tracing on: request_log.recorded starts the spans

    async def _limits(self) -> tuple[Limits, worker_pb2.WorkerServiceGetModelInfoResponse]:
        if self.draining:
            raise Unavailable("frontend is shutting down")
        if not self.pool.serving:  # a fresh process: its worker may be a moment from answering
            await self.pool.wait_serving(self.config.worker_connect_timeout_s)
        info = self.pool.model_info()
        return Limits(
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            max_stop_strings=self.config.max_stop_strings,
            max_stop_string_length=self.config.max_stop_string_length,
            max_prompt_bytes=self.config.max_prompt_bytes,
            # the frontend's own bound, and the worker's (it refuses more): the lower one
            max_stop_token_ids=min(
                self.config.max_stop_token_ids,
                info.max_stop_token_ids or self.config.max_stop_token_ids,
            ),
            max_chat_messages=self.config.max_chat_messages,
            eos_token_ids=tuple(info.eos_token_ids),
        ), info

    @contextlib.contextmanager
    def _admit(self, request_id: str) -> Iterator[str]:
        """Counts the call in flight, or refuses it past max_concurrent_requests."""
        if self.num_in_flight >= self.config.max_concurrent_requests:
            raise ResourceExhausted(
                f"{self.num_in_flight} requests in flight (max_concurrent_requests); retry later"
            )
        request_id = request_id or uuid.uuid4().hex
        key = (current_tenant(), request_id)
        if key in self._live_request_ids:
            raise AlreadyExists(f"request_id {request_id!r} is already in flight")
        self.num_in_flight += 1
        self._live_request_ids.add(key)
        try:
            yield request_id
        finally:
            self.num_in_flight -= 1
            self._live_request_ids.discard(key)

    @recorded
    @grpc_errors
    async def Generate(
        self, request: frontend_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[frontend_pb2.GenerateResponse]:
        """Streams the completion of a raw prompt (text or token ids)."""
        limits, _ = await self._limits()
        validate_request_id(request.request_id)
        if request.prompt and request.prompt_token_ids:
            raise InvalidArgument("set exactly one of prompt and prompt_token_ids", field="prompt")
        if request.prompt_token_ids:
            validate_prompt_token_ids(request.prompt_token_ids, limits, "prompt_token_ids")
        else:
            validate_text(request.prompt, limits, "prompt")
        params = validate_sampling_params(request.sampling_params, limits)
        interval = stream_interval_of(request, self.config.stream_interval)
        with self._admit(request.request_id) as request_id:
            if request.prompt_token_ids:
                prompt_ids = list(request.prompt_token_ids)
            else:
                add_special = (
                    not request.HasField("add_special_tokens") or request.add_special_tokens
                )
                prompt_ids = await self.tokenizer.encode_async(request.prompt, add_special)
                validate_prompt_token_ids(prompt_ids, limits, "prompt")
            mark_tokenized()
            prompt_field = "prompt_token_ids" if request.prompt_token_ids else "prompt"
            send_prompt_ids = request.return_prompt_token_ids
            async for fields in self.requests.stream(
                request_id,
                prompt_ids,
                params,
                limits,
                context,
                prompt_field,
                request.priority,
                interval,
            ):
                if send_prompt_ids:  # on the call's first message
                    fields["prompt_token_ids"], send_prompt_ids = prompt_ids, False
                yield frontend_pb2.GenerateResponse(**fields)

    @recorded
    @grpc_errors
    async def Chat(
        self, request: frontend_pb2.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[frontend_pb2.ChatResponse]:
        """Applies the chat template to the messages and streams the reply."""
        limits, _ = await self._limits()
        validate_request_id(request.request_id)
        inputs = chat_inputs(request, limits)  # messages counted before any is read
        params = validate_sampling_params(request.sampling_params, limits)
        if not params.detokenize:
            raise InvalidArgument(
                "a Chat reply is text (its reasoning and tool calls are parsed from it); "
                "Generate streams ids only",
                field="sampling_params.detokenize",
            )
        interval = stream_interval_of(request, self.config.stream_interval)
        if not self.tokenizer.has_chat_template:
            raise FailedPrecondition("the model's tokenizer_config.json has no chat template")
        enable_thinking = not request.HasField("enable_thinking") or request.enable_thinking
        with self._admit(request.request_id) as request_id:
            prompt_ids = await self.tokenizer.encode_chat_async(
                inputs.messages, enable_thinking, inputs.tools, inputs.size
            )
            validate_prompt_token_ids(prompt_ids, limits, "messages")
            mark_tokenized()
            think = think_in_prompt(prompt_ids, self.tokenizer.token_to_id)
            if inputs.forced is not None:  # the calls, as a structural tag the worker compiles
                params = constrained_params(params, inputs.forced, think)
            outputs: dict[int, ChatOutput] = {}  # one parser state per completion (n > 1)

            def output(index: int) -> ChatOutput:
                if index not in outputs:
                    outputs[index] = ChatOutput(
                        ReasoningParser(think == "open") if request.separate_reasoning else None,
                        ToolCallParser(single_call=inputs.single_call)
                        if inputs.parse_tool_calls
                        else None,
                        think_open=think == "open",
                    )
                return outputs[index]

            stream = self.requests.stream(
                request_id,
                prompt_ids,
                params,
                limits,
                context,
                "messages",
                request.priority,
                interval,
            )
            send_prompt_ids = request.return_prompt_token_ids
            try:
                async for fields in stream:
                    message = output(fields.get("index", 0)).update(fields)
                    if send_prompt_ids:  # on the call's first message
                        message["prompt_token_ids"], send_prompt_ids = prompt_ids, False
                    yield frontend_pb2.ChatResponse(**message)
            except InvalidArgument as e:
                # the worker could not compile the forced calls' tag: the tools' schemas did it
                if inputs.forced is None or FORCED_TAG_FIELD not in e.message:
                    raise
                detail = e.message.split(f"{FORCED_TAG_FIELD}: ", 1)[-1]
                raise InvalidArgument(detail, field=inputs.forced.field) from None

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
    async def Detokenize(
        self, request: frontend_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.DetokenizeResponse:
        """Returns the text of token ids, whole and per id: at most a full context of ids
        (max_model_len), each below the model's vocab_size."""
        limits, _ = await self._limits()
        token_ids = request.token_ids
        if not token_ids:
            raise InvalidArgument("must not be empty", field="token_ids")
        if len(token_ids) > limits.max_model_len:  # a repeated field's len() walks nothing
            raise InvalidArgument(
                f"{len(token_ids)} ids > max_model_len ({limits.max_model_len})", field="token_ids"
            )
        for i, token_id in enumerate(token_ids):
            if token_id >= limits.vocab_size:
                raise InvalidArgument(
                    f"token id {token_id} >= vocab_size {limits.vocab_size}",
                    field=f"token_ids[{i}]",
                )
        skip = not request.HasField("skip_special_tokens") or request.skip_special_tokens
        ids = list(token_ids)
        with self._admit(""):  # decoding holds a tokenizer thread like a Generate call
            text, pieces = await self.tokenizer.run(self._decode, ids, skip)
        return frontend_pb2.DetokenizeResponse(text=text, token_texts=pieces)

    def _decode(self, token_ids: list[int], skip_special_tokens: bool) -> tuple[str, list[str]]:
        return (
            self.tokenizer.decode(token_ids, skip_special_tokens),
            self.tokenizer.token_texts(token_ids),
        )

    @grpc_errors
    async def GetModelInfo(
        self, request: frontend_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.GetModelInfoResponse:
        """Returns the model's name and limits as the worker reported them."""
        _, info = await self._limits()
        return frontend_pb2.GetModelInfoResponse(
            model_name=info.model_name,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            eos_token_ids=info.eos_token_ids,
            tensor_parallel_size=info.tensor_parallel_size,
            has_chat_template=self.tokenizer.has_chat_template,
        )
