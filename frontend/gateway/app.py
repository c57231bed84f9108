"""The gateway's HTTP routes (FastAPI): each OpenAI request is checked (protocol.py; body_parse.py
parses large bodies off the event loop), mapped onto a
FrontendService call (params.py) made through one shared nanoserve.AsyncClient with the caller's
own bearer token, and its chunks (completions: echoed by echo.py, the best_of kept by best_of.py) are
answered whole (responses.py) or as server-sent events (stream.py); /tokenize and /detokenize
are tokens.py's.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from nanoserve.client import AsyncClient
from nanoserve.client.messages import Chunk, Completion, ModelInfo, join_chunks
from nanoserve.errors import ServiceError
from nanoserve.frontend.gateway.access import access_of
from nanoserve.frontend.gateway.best_of import keep_best
from nanoserve.frontend.gateway.body_parse import BodyParser
from nanoserve.frontend.gateway.caller_auth import CallerAuth
from nanoserve.frontend.gateway.echo import echo_chunks
from nanoserve.frontend.gateway.errors import (
    OpenAIError,
    from_service_error,
    from_validation_errors,
)
from nanoserve.frontend.gateway.params import Mapped, map_chat, map_completion
from nanoserve.frontend.gateway.protocol import ChatCompletionRequest, CompletionRequest
from nanoserve.frontend.gateway.responses import Reply
from nanoserve.frontend.gateway.stream import StreamShaper, events
from nanoserve.frontend.gateway.tokens import DetokenizeBody, TokenizeBody, detokenize, tokenize
from nanoserve.tracing import TRACEPARENT
from nanoserve.wire import MAX_STREAM_INTERVAL

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Runs `work` while watching for the caller hanging up, which cancels it (and so its gRPC
    call). Used only before a streaming response starts: from then on Starlette watches."""
    task = asyncio.ensure_future(work)

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise OpenAIError(499, "client closed the request", "cancelled")
    return task.result()


class Gateway:
    """Route handlers around one AsyncClient (one channel to the frontend) and one BodyParser."""

    def __init__(
        self,
        client: AsyncClient,
        served_model_name: str | None,
        bodies: BodyParser,
        stream_interval: int = 1,
    ) -> None:
        self.client = client
        self.auth = CallerAuth(client)  # every route but /health: the key before the body
        self._model_name = served_model_name
        self._info: ModelInfo | None = None  # the frontend's answer, asked once
        self.bodies = bodies
        self._stream_interval = stream_interval
        self._connected = False  # every frontend connection was ready once (health)

    def stream_interval(self, mapped: Mapped) -> int:
        """How many ids the frontend batches per message: a streamed reply's events come per
        --stream-interval tokens; a whole reply in as few messages as the frontend allows (each
        gRPC message costs the gateway more CPU than its tokens do)."""
        return self._stream_interval if mapped.stream else MAX_STREAM_INTERVAL

    async def model_info(self, client: AsyncClient) -> ModelInfo:
        """The frontend's ModelInfo, asked once."""
        if self._info is None:
            try:
                self._info = await client.model_info()
            except ServiceError as e:
                raise from_service_error(e) from None
        return self._info

    async def model_name(self, client: AsyncClient) -> str:
        """The served model's name: the configured one, else the frontend's."""
        return self._model_name or (await self.model_info(client)).model_name

    async def reply(self, client: AsyncClient, name: str, chat: bool, mapped: Mapped) -> Reply:
        """The reply's shape; its stop_reason leaves the model's eos ids out (vLLM's rule)."""
        eos = frozenset((await self.model_info(client)).eos_token_ids)
        return Reply(name, chat, logprobs=mapped.logprobs, token_ids=mapped.token_ids, eos=eos)

    async def check_model(self, client: AsyncClient, model: str) -> str:
        name = await self.model_name(client)
        if model != name:
            raise OpenAIError(
                404,
                f"the model `{model}` does not exist",
                "not_found_error",
                "model",
                "model_not_found",
            )
        return name

    async def health(self) -> Response:
        """SERVING once every connection to the frontends is up and the frontend serves: a
        burst right after a start (or a scale-up) would otherwise meet connections still waiting
        out a reconnect backoff, whose calls fail."""
        if not self._connected:
            self._connected = await self.client.connect(1.0)
            if not self._connected:
                return JSONResponse({"status": "CONNECTING"}, status_code=503)
        try:
            status = await self.client.health()
        except ServiceError as e:
            status = e.code.name
        return JSONResponse({"status": status}, status_code=200 if status == "SERVING" else 503)

    async def models(self, request: Request) -> dict:
        """Asks the frontend every time, with the caller's token: the listing is not open."""
        client = await self.auth.client_for(request)
        try:
            info = await _until_disconnect(request, client.model_info())
        except ServiceError as e:
            raise from_service_error(e) from None
        name = self._model_name or info.model_name
        model = {"id": name, "object": "model", "created": 0, "owned_by": "nanoserve"}
        return {"object": "list", "data": [model]}

    async def completions(self, request: Request) -> Response:
        client = await self.auth.client_for(request)  # 401 before the body is read
        body = await self.bodies.parse(CompletionRequest, await request.body())
        prompt, mapped = map_completion(body)
        client = _parsed(request, client)
        name = await _until_disconnect(request, self.check_model(client, body.model))
        reply = await _until_disconnect(request, self.reply(client, name, False, mapped))
        echo, best_of = mapped.echo, mapped.best_of
        request_id = access_of(request.scope).request_id

        def start() -> AsyncIterator[Chunk]:
            chunks = client.generate_stream(
                prompt,
                request_id=request_id,
                **mapped.kwargs(),
                stream_interval=self.stream_interval(mapped),
            )
            return chunks if echo is None else echo_chunks(echo, chunks, client)

        def finish(whole: Completion) -> Completion:
            return whole if best_of is None else keep_best(whole, best_of)

        return await self._answer(request, reply, mapped, start, finish)

    async def chat_completions(self, request: Request) -> Response:
        client = await self.auth.client_for(request)  # 401 before the body is read
        body = await self.bodies.parse(ChatCompletionRequest, await request.body())
        messages, mapped = map_chat(body)
        client = _parsed(request, client)
        name = await _until_disconnect(request, self.check_model(client, body.model))
        reply = await _until_disconnect(request, self.reply(client, name, True, mapped))
        request_id = access_of(request.scope).request_id
        return await self._answer(
            request,
            reply,
            mapped,
            lambda: client.chat_stream(
                messages,
                request_id=request_id,
                **mapped.kwargs(),
                stream_interval=self.stream_interval(mapped),
            ),
        )

    async def tokenize(self, request: Request) -> dict:
        client = await self.auth.client_for(request)  # 401 before the body is read
        body = await self.bodies.parse(TokenizeBody, await request.body())
        if body.model is not None:
            await _until_disconnect(request, self.check_model(client, body.model))
        return await _until_disconnect(request, tokenize(client, body))

    async def detokenize(self, request: Request) -> dict:
        client = await self.auth.client_for(request)  # 401 before the body is read
        body = await self.bodies.parse(DetokenizeBody, await request.body())
        if body.model is not None:
            await _until_disconnect(request, self.check_model(client, body.model))
        return await _until_disconnect(request, detokenize(client, body))

    async def _answer(
        self,
        request: Request,
        reply: Reply,
        mapped: Mapped,
        start: Callable[[], AsyncIterator[Chunk]],
        finish: Callable[[Completion], Completion] = lambda whole: whole,
    ) -> Response:
        """The whole reply (`finish` has the last word on it), or a stream of events once the
        first chunk came: a call refused at the start (400, 401, 429, ...) gets its HTTP status,
        not a 200 stream with an error."""
        access = access_of(request.scope)
        try:
            chunks = start()  # a sampling value the client cannot send: INVALID_ARGUMENT
            if not mapped.stream:
                whole = finish(join_chunks(await _until_disconnect(request, _collect(chunks))))
                access.ended(whole.usage, whole.finish_reason)
                return JSONResponse(reply.whole(whole))
            first = await _until_disconnect(request, anext(chunks))
        except ServiceError as e:
            raise from_service_error(e, mapped.param_names) from None
        except OpenAIError:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise
        shaper = StreamShaper(reply, mapped.n, mapped.include_usage)
        return StreamingResponse(
            events(shaper, first, chunks, mapped.param_names, access),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def _parsed(request: Request, client: AsyncClient) -> AsyncClient:
    """Marks the end of parsing; while tracing, `client` sends the request's traceparent."""
    access = access_of(request.scope)
    access.parsed_at = time.perf_counter()
    if access.span is None:
        return client
    return client.with_metadata(((TRACEPARENT, access.span.traceparent),))


async def _collect(chunks: AsyncIterator[Chunk]) -> list[Chunk]:
    return [chunk async for chunk in chunks]


def _error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def build_app(
    client: AsyncClient,
    served_model_name: str | None = None,
    parse_processes: int = 2,
    stream_interval: int = 1,
) -> FastAPI:
    """The ASGI app; `client` is shared by every request (the caller closes it). Its lifespan
    starts and stops the processes that parse large bodies."""
    bodies = BodyParser(parse_processes)
    gateway = Gateway(client, served_model_name, bodies, stream_interval)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await bodies.warm(CompletionRequest)
        # the frontend connections, open before the first burst (not waited for: a frontend
        # that is not up yet is connected to as calls come)
        connecting = asyncio.ensure_future(client.connect(30.0))
        try:
            yield
        finally:
            connecting.cancel()
            bodies.close()

    app = FastAPI(
        title="nanoserve OpenAI-compatible gateway",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # no unauthenticated route but /health (the gateway cannot tell who)
        lifespan=lifespan,
    )

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error_response(from_validation_errors(error.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "internal_error"
        return _error_response(OpenAIError(error.status_code, str(error.detail), kind))

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return _error_response(OpenAIError(500, "internal error", "internal_error"))

    app.add_api_route("/health", gateway.health, methods=["GET"])
    app.add_api_route("/v1/models", gateway.models, methods=["GET"])
    app.add_api_route("/v1/completions", gateway.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", gateway.chat_completions, methods=["POST"])
    app.add_api_route("/tokenize", gateway.tokenize, methods=["POST"])  # vLLM's extras
    app.add_api_route("/detokenize", gateway.detokenize, methods=["POST"])
    return app
