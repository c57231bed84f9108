"""nanoserve.client against an in-process fake FrontendService: chunks, joined completions, typed
errors, early stop cancels the call, wait_ready."""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve import errors
from nanoserve.client import AsyncClient, Chunk, Client, Usage, sampling_params
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc

SERVICE = "nanoserve.v1.FrontendService"


class FakeFrontend(frontend_grpc.FrontendServiceServicer):
    def __init__(self) -> None:
        self.requests: list = []
        self.ended = threading.Event()

    def _reply(self, texts: list[str], context) -> Iterator[frontend_pb2.GenerateResponse]:
        context.add_callback(self.ended.set)
        for i, text in enumerate(texts):
            yield frontend_pb2.GenerateResponse(text=text, token_ids=[10 + i])
        yield frontend_pb2.GenerateResponse(
            token_ids=[99],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            matched_stop="\n",
            usage=common_pb2.Usage(
                prompt_tokens=4, completion_tokens=len(texts) + 1, cached_tokens=2
            ),
        )

    def Generate(self, request, context):
        self.requests.append(request)
        if request.prompt == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.top_p: must be > 0")
        if request.prompt == "busy":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        if request.prompt == "slow":
            context.add_callback(self.ended.set)
            while context.is_active():
                yield frontend_pb2.GenerateResponse(text="x", token_ids=[1])
                time.sleep(0.01)
            return
        yield from self._reply(["Hel", "lo 世", "界"], context)

    def Chat(self, request, context):
        self.requests.append(request)
        yield from self._reply([m.content for m in request.messages], context)

    def Tokenize(self, request, context):
        add_special = not request.HasField("add_special_tokens") or request.add_special_tokens
        ids = [ord(c) for c in request.text] + ([0] if add_special else [])
        return frontend_pb2.TokenizeResponse(token_ids=ids)

    def GetModelInfo(self, request, context):
        return frontend_pb2.GetModelInfoResponse(
            model_name="m",
            max_model_len=32,
            vocab_size=100,
            eos_token_ids=[7],
            tensor_parallel_size=2,
            has_chat_template=True,
        )


@pytest.fixture
def server() -> Iterator[tuple[str, FakeFrontend, health.HealthServicer]]:
    fake, health_servicer = FakeFrontend(), health.HealthServicer()
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    grpc_server = grpc.server(ThreadPoolExecutor(4))
    frontend_grpc.add_FrontendServiceServicer_to_server(fake, grpc_server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    yield f"127.0.0.1:{port}", fake, health_servicer
    grpc_server.stop(0)


def test_generate_stream_and_joined(server) -> None:
    address, fake, _ = server
    with Client(address, timeout=5) as client:
        chunks = list(client.generate_stream("hi", max_tokens=8, temperature=0.0, stop="\n"))
        assert chunks[0] == Chunk("Hel", [10])
        assert chunks[-1].finish_reason == "stop" and chunks[-1].usage == Usage(4, 4, 2)
        assert all(c.finish_reason is None for c in chunks[:-1])
        params = fake.requests[0].sampling_params
        assert (params.max_tokens, list(params.stop)) == (8, ["\n"])
        assert params.HasField("temperature") and not params.HasField("top_p")
        completion = client.generate([1, 2, 3], seed=3)
        assert fake.requests[1].prompt_token_ids == [1, 2, 3] and not fake.requests[1].prompt
        assert (completion.text, completion.token_ids) == ("Hello 世界", [10, 11, 12, 99])
        assert (completion.finish_reason, completion.matched_stop) == ("stop", "\n")
        assert completion.matched_stop_token_id is None


def test_chat_tokenize_model_info(server) -> None:
    address, fake, _ = server
    with Client(address) as client:
        reply = client.chat(
            [{"role": "user", "content": "a"}, ("assistant", "b")], enable_thinking=False
        )
        assert reply.text == "ab"
        request = fake.requests[0]
        assert [(m.role, m.content) for m in request.messages] == [
            ("user", "a"),
            ("assistant", "b"),
        ]
        assert request.HasField("enable_thinking") and not request.enable_thinking
        assert client.tokenize("ab") == [97, 98, 0]
        assert client.tokenize("ab", add_special_tokens=False) == [97, 98]
        info = client.model_info()
        assert (info.model_name, info.eos_token_ids, info.tensor_parallel_size) == ("m", [7], 2)


def test_errors_are_typed(server) -> None:
    address, _, _ = server
    with Client(address) as client:
        with pytest.raises(errors.InvalidArgument, match="sampling_params.top_p"):
            client.generate("bad")
        with pytest.raises(errors.ResourceExhausted):
            list(client.generate_stream("busy"))
        with pytest.raises(errors.DeadlineExceeded):
            client.generate("slow", timeout=0.2)
    with pytest.raises(TypeError, match="temprature"):
        sampling_params(temprature=1.0)
    with Client("127.0.0.1:1") as dead, pytest.raises(errors.Unavailable):
        dead.generate("x", timeout=2)


def test_logit_bias_and_allowed_token_ids_kwargs() -> None:
    params = sampling_params(logit_bias={"5": 100, 7: -1.5}, allowed_token_ids=[5, 7, 9])
    assert dict(params.logit_bias) == {5: 100.0, 7: -1.5}
    assert list(params.allowed_token_ids) == [5, 7, 9]
    assert not sampling_params(temperature=0).logit_bias


def test_breaking_out_of_the_stream_cancels(server) -> None:
    address, fake, _ = server
    with Client(address) as client:
        stream = client.generate_stream("slow")
        assert next(stream).text == "x"
        stream.close()
        assert fake.ended.wait(2)


def test_wait_ready(server) -> None:
    address, _, health_servicer = server
    with Client(address) as client:
        assert client.health() == "NOT_SERVING"
        with pytest.raises(errors.DeadlineExceeded):
            client.wait_ready(timeout=0.3)
        threading.Timer(
            0.2, health_servicer.set, (SERVICE, health_pb2.HealthCheckResponse.SERVING)
        ).start()
        client.wait_ready(timeout=5)
        assert client.health() == "SERVING"


def test_async_client(server) -> None:
    address, fake, health_servicer = server
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def main() -> None:
        async with AsyncClient(address, timeout=5) as client:
            await client.wait_ready(timeout=5)
            texts = [c.text async for c in client.generate_stream("hi", max_tokens=3)]
            assert texts == ["Hel", "lo 世", "界", ""]
            assert (await client.generate("hi")).usage == Usage(4, 4, 2)
            assert (await client.chat([("user", "q")])).text == "q"
            assert await client.tokenize("a") == [97, 0]
            assert (await client.model_info()).max_model_len == 32
            with pytest.raises(errors.InvalidArgument):
                await client.generate("bad")
            stream = client.generate_stream("slow")
            assert (await anext(stream)).text == "x"
            await stream.aclose()
        assert await asyncio.to_thread(fake.ended.wait, 2)

    asyncio.run(main())


def test_chat_request_tools_and_tool_call_history() -> None:
    from nanoserve.client.messages import ToolCall, join_chunks, to_chunk
    from nanoserve.client.requests import chat_request

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    earlier = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    request = chat_request(
        [
            ("user", "Weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [earlier],
                "reasoning_content": "r",
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c2", "function": {"name": "f", "arguments": {"a": 1}}}],
            },
        ],
        tools=[weather],
        tool_choice="auto",
        separate_reasoning=True,
        max_tokens=8,
    )
    assert request.separate_reasoning and request.tool_choice == "auto"
    assert request.tools[0].function.name == "get_weather"
    assert json.loads(request.tools[0].function.parameters) == weather["function"]["parameters"]
    assistant, tool, second = request.messages[1], request.messages[2], request.messages[3]
    assert (assistant.content, assistant.reasoning_content) == ("", "r")
    assert assistant.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert (tool.tool_call_id, tool.name) == ("call_1", "get_weather")
    assert (second.tool_calls[0].type, second.tool_calls[0].function.arguments) == (
        "function",
        '{"a": 1}',
    )
    assert not chat_request([("user", "hi")]).HasField("separate_reasoning")
    forced = chat_request([("user", "hi")], tools=[weather], tool_choice_function="get_weather")
    assert (forced.tool_choice, forced.tool_choice_function) == ("", "get_weather")
    required = chat_request([("user", "hi")], tools=[weather], tool_choice="required")
    assert (required.tool_choice, required.tool_choice_function) == ("required", "")
    assert not required.HasField("parallel_tool_calls")  # unset: the server's default, true
    single = chat_request([("user", "hi")], tool_choice="required", parallel_tool_calls=False)
    assert single.HasField("parallel_tool_calls") and not single.parallel_tool_calls

    call = frontend_pb2.ToolCall(
        id="call_9",
        type="function",
        function=frontend_pb2.ToolCallFunction(name="f", arguments="{}"),
    )
    chunks = [
        to_chunk(frontend_pb2.ChatResponse(text="", reasoning_content="think", token_ids=[1])),
        to_chunk(
            frontend_pb2.ChatResponse(
                text="<tool_call>x</tool_call>",
                tool_calls=[call],
                tool_call_parse_error=True,
                finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS,
                usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=2),
            )
        ),
    ]
    completion = join_chunks(chunks)
    assert completion.finish_reason == "tool_calls" and completion.reasoning_content == "think"
    assert completion.tool_calls == (ToolCall("call_9", "f", "{}"),)
    assert completion.tool_call_parse_error
    assert completion.tool_calls[0].to_dict()["function"] == {"name": "f", "arguments": "{}"}


def test_async_client_with_token_shares_the_channel_with_another_token() -> None:
    """The gateway's per-caller view: same channel and stubs, the caller's own bearer token."""

    async def run() -> None:
        client = AsyncClient("127.0.0.1:1", token="gateway-own")
        view = client.with_token("caller")
        assert view._channel is client._channel and view._stub is client._stub
        assert view._metadata == (("authorization", "Bearer caller"),)
        assert client._metadata == (("authorization", "Bearer gateway-own"),)  # unchanged
        assert client.with_token(None)._metadata == ()
        await client.close()

    asyncio.run(run())


def test_async_client_passes_over_failing_connections() -> None:
    """Calls are dealt round-robin over the connections that are not failing (a frontend process
    restarting): a call on a failing one would end UNAVAILABLE while the others serve."""
    import asyncio

    import grpc

    from nanoserve.client import AsyncClient

    class Channel:
        def __init__(self, state: grpc.ChannelConnectivity) -> None:
            self.state = state

        def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
            return self.state

    async def main() -> None:
        client = AsyncClient("127.0.0.1:1", connections=3)
        await client.close()
        ready, failing = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE
        client._channels = [Channel(ready), Channel(failing), Channel(ready)]  # type: ignore[list-item]
        picked = [client._stubs.index(client._stub) for _ in range(6)]
        assert 1 not in picked and set(picked) == {0, 2}
        client._channels = [Channel(failing)] * 3  # type: ignore[list-item]
        assert {client._stubs.index(client._stub) for _ in range(6)} == {0, 1, 2}

    asyncio.run(main())


def test_blocking_client_deals_calls_over_its_connections() -> None:
    """Client(connections=3): three channels, each its own connection, calls dealt round-robin
    past those whose subscription last said failing; connections < 1 is refused by name."""
    import grpc
    import pytest

    from nanoserve.client import AsyncClient, Client

    with Client("127.0.0.1:1", connections=3) as client:
        assert len(client._channels) == 3 and len(set(map(id, client._stubs))) == 3
        assert [client._stubs.index(client._stub) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
        ready, failing = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE
        client._states[:] = [ready, failing, ready]
        picked = [client._stubs.index(client._stub) for _ in range(6)]
        assert 1 not in picked and set(picked) == {0, 2}
        client._states[:] = [failing] * 3
        assert {client._stubs.index(client._stub) for _ in range(6)} == {0, 1, 2}
    with Client("127.0.0.1:1") as one:
        assert one._stub is one._stubs[0] and len(one._channels) == 1
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="connections"):
            make("127.0.0.1:1", connections=0)
