"""The gateway's mapping of n, logprobs, structured output, tools, reasoning and priority: OpenAI
request -> gRPC request, and recorded gRPC responses -> OpenAI bodies and stream events."""

import asyncio
import json

import grpc
import pytest

pytest.importorskip("fastapi", reason="the gateway extra: pip install 'nanoserve[gateway]'")

from nanoserve.client.messages import join_chunks, to_chunk
from nanoserve.client.requests import chat_request, generate_request
from nanoserve.errors import error_for_code
from nanoserve.frontend.gateway.errors import from_service_error
from nanoserve.frontend.gateway.params import map_chat, map_completion
from nanoserve.frontend.gateway.protocol import ChatCompletionRequest, CompletionRequest
from nanoserve.frontend.gateway.responses import Reply
from nanoserve.frontend.gateway.stream import StreamShaper, events
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as pb

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "d", "parameters": SCHEMA},
}
STOP, CALLS = common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_TOOL_CALLS


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields})


def chat(**fields) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "Hi"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})


def lp(token_id: int, logprob: float, text: str, top=()) -> common_pb2.TokenLogprobs:
    alternatives = [common_pb2.TokenLogprob(token_id=i, logprob=p, text=t) for i, p, t in top]
    return common_pb2.TokenLogprobs(
        token_id=token_id, logprob=logprob, rank=1, text=text, top_logprobs=alternatives
    )


def parse(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


def test_n_logprobs_priority_and_structured_output_map_onto_the_generate_request() -> None:
    _, mapped = map_completion(
        completion(
            n=3,
            seed=1,
            logprobs=2,
            prompt_logprobs=1,
            logprobs_mode="processed",
            priority=-5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        )
    )
    assert mapped.n == 3 and mapped.logprobs and mapped.call == {"priority": -5}
    request = generate_request("Hi", **mapped.kwargs())
    params = request.sampling_params
    assert (params.n, params.logprobs, params.prompt_logprobs) == (3, 2, 1)
    assert params.logprobs_mode == common_pb2.LOGPROBS_MODE_PROCESSED
    assert json.loads(params.structured_output.json_schema) == SCHEMA
    assert request.priority == -5
    names = mapped.param_names
    assert names["sampling_params.structured_output.json_schema"] == "response_format"
    assert names["sampling_params.n"] == "n" and names["sampling_params.logprobs"] == "logprobs"


@pytest.mark.parametrize(
    ("fields", "kind", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", True),
        ({"guided_regex": "[ab]+"}, "regex", "[ab]+"),
        ({"guided_grammar": 'root ::= "x"'}, "grammar", 'root ::= "x"'),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
    ],
)
def test_response_format_and_guided_extras_pick_one_structured_output(
    fields: dict, kind: str, value: object
) -> None:
    _, mapped = map_chat(chat(**fields))
    params = chat_request([], **mapped.kwargs()).sampling_params
    assert params.structured_output.WhichOneof("kind") == kind
    assert getattr(params.structured_output, kind) == value


def test_a_schema_the_worker_refuses_is_a_400_naming_response_format() -> None:
    _, mapped = map_chat(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
    )
    refused = error_for_code(
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling_params.structured_output.json_schema: does not compile",
    )
    error = from_service_error(refused, mapped.param_names)
    assert error.status == 400 and error.param == "response_format"


def test_chat_logprobs_tools_and_history_map_onto_the_chat_request() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages, mapped = map_chat(
        chat(
            messages=[
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            logprobs=True,
            top_logprobs=3,
            tools=[TOOL],
            tool_choice="auto",
            separate_reasoning=True,
            n=2,
        )
    )
    assert mapped.logprobs and mapped.sampling == {"n": 2, "logprobs": 3}
    request = chat_request(messages, **mapped.kwargs())
    assert request.tool_choice == "auto" and request.separate_reasoning
    assert request.tools[0].function.name == "get_weather"
    assert json.loads(request.tools[0].function.parameters) == SCHEMA
    assistant, tool = request.messages[1], request.messages[2]
    assert assistant.content == "" and assistant.tool_calls[0].function.name == "f"
    assert tool.role == "tool" and tool.tool_call_id == "call_1" and tool.content == "sunny"
    assert map_chat(chat(logprobs=True))[1].sampling == {"logprobs": 0}


def _tool_call_stream() -> list[pb.ChatResponse]:
    """A recorded Chat stream: reasoning, text, a tool call, the finish and the usage."""
    call = pb.ToolCall(
        id="call_9",
        type="function",
        function=pb.ToolCallFunction(name="get_weather", arguments='{"a": 1}'),
    )
    return [
        pb.ChatResponse(token_ids=[5], reasoning_content="Think"),
        pb.ChatResponse(token_ids=[6], reasoning_content=" more"),
        pb.ChatResponse(text="Let me check.", token_ids=[7]),
        pb.ChatResponse(token_ids=[8, 9, 10], tool_calls=[call]),
        pb.ChatResponse(
            token_ids=[11],
            finish_reason=CALLS,
            usage=common_pb2.Usage(prompt_tokens=30, completion_tokens=7),
        ),
    ]


async def _stream(reply: Reply, responses: list, n: int = 1) -> list[dict]:
    chunks = [to_chunk(r) for r in responses]

    async def rest():
        for chunk in chunks[1:]:
            yield chunk

    shaper = StreamShaper(reply, n, include_usage=True)
    return [
        json.loads(e[6:]) if e != b"data: [DONE]\n\n" else "[DONE]"
        async for e in events(shaper, chunks[0], rest(), {})
    ]


def test_a_recorded_chat_stream_with_tool_calls_and_reasoning_becomes_openai_deltas() -> None:
    bodies = asyncio.run(_stream(Reply("m", chat=True), _tool_call_stream()))
    assert bodies[-1] == "[DONE]"
    usage = bodies[-2]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 37
    deltas = [b["choices"][0]["delta"] for b in bodies[:-2]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Think"},
        {"reasoning_content": " more"},
        {"content": "Let me check."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"a": 1}'},
                }
            ]
        },
        {},
    ]
    assert [b["choices"][0]["finish_reason"] for b in bodies[:-2]] == [None] * 5 + ["tool_calls"]
    assert all(b["usage"] is None and b["object"] == "chat.completion.chunk" for b in bodies[:-2])


def test_the_whole_chat_reply_carries_tool_calls_reasoning_and_logprobs() -> None:
    responses = _tool_call_stream()
    responses[2].logprobs.extend([lp(7, -0.5, "Let", [(7, -0.5, "Let"), (3, -1.5, "So")])])
    body = Reply("m", chat=True).whole(join_chunks(to_chunk(r) for r in responses))
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check." and message["reasoning_content"] == "Think more"
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"a": 1}'}
    assert "index" not in message["tool_calls"][0]
    assert (
        Reply("m", chat=True).whole(join_chunks([to_chunk(responses[-1])]))["choices"][0][
            "logprobs"
        ]
        is None
    )
    assert "tool_call_parse_error" not in choice
    asked = Reply("m", chat=True, logprobs=True).whole(join_chunks([to_chunk(responses[-1])]))
    assert asked["choices"][0]["logprobs"] == {"content": []}
    (entry,) = choice["logprobs"]["content"]
    assert entry["token"] == "Let" and entry["logprob"] == -0.5 and entry["bytes"] == [76, 101, 116]
    assert [t["token"] for t in entry["top_logprobs"]] == ["Let", "So"]


def test_n_completions_are_choices_by_index_streamed_and_whole() -> None:
    usage = common_pb2.Usage(prompt_tokens=4, completion_tokens=5)
    responses = [
        pb.GenerateResponse(text="a", token_ids=[1], index=0, logprobs=[lp(1, -0.1, "a")]),
        pb.GenerateResponse(text="x", token_ids=[2], index=1, logprobs=[lp(2, -0.2, "x")]),
        pb.GenerateResponse(text="bc", token_ids=[3], index=0, logprobs=[lp(3, -0.3, "bc")]),
        pb.GenerateResponse(token_ids=[4], index=0, finish_reason=STOP, logprobs=[lp(4, 0, "")]),
        pb.GenerateResponse(
            text="y", token_ids=[5], index=1, finish_reason=STOP, usage=usage,
            logprobs=[lp(5, float("-inf"), "y", [(9, -0.01, "z")])],
        ),
    ]  # fmt: skip
    body = Reply("m", chat=False).whole(join_chunks(to_chunk(r) for r in responses))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == ["abc", "xy"]
    assert body["usage"]["completion_tokens"] == 5
    legacy = body["choices"][0]["logprobs"]
    assert legacy["tokens"] == ["a", "bc", ""] and legacy["text_offset"] == [0, 1, 3]
    assert legacy["token_logprobs"] == pytest.approx([-0.1, -0.3, 0.0])
    assert body["choices"][1]["logprobs"]["top_logprobs"][1] == {
        "z": pytest.approx(-0.01),
        "y": -9999.0,
    }
    streamed = asyncio.run(_stream(Reply("m", chat=False), responses, n=2))
    texts: dict[int, str] = {}
    offsets: dict[int, list[int]] = {}
    for b in streamed[:-2]:
        (c,) = b["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        offsets.setdefault(c["index"], []).extend(c["logprobs"]["text_offset"])
    assert texts == {0: "abc", 1: "xy"} and offsets[0] == [0, 1, 3]
    assert streamed[-2]["usage"]["prompt_tokens"] == 4


def test_a_stream_missing_a_choices_finish_is_an_error_event() -> None:
    responses = [
        pb.GenerateResponse(
            text="a", token_ids=[1], finish_reason=STOP, usage=common_pb2.Usage(prompt_tokens=1)
        )
    ]
    bodies = asyncio.run(_stream(Reply("m", chat=False), responses, n=2))
    assert bodies[-2]["error"]["type"] == "internal_error" and bodies[-1] == "[DONE]"


def test_prompt_logprobs_are_vllms_list_with_position_zero_null() -> None:
    response = pb.GenerateResponse(
        text="a",
        token_ids=[1],
        finish_reason=STOP,
        usage=common_pb2.Usage(prompt_tokens=2, completion_tokens=1),
        prompt_logprobs=[lp(8, -2.0, "lo", [(3, -1.0, "hi")])],
    )
    body = Reply("m", chat=False).whole(join_chunks([to_chunk(response)]))
    assert body["choices"][0]["prompt_logprobs"] == [
        None,
        {
            "3": {"logprob": -1.0, "rank": 1, "decoded_token": "hi"},
            "8": {"logprob": -2.0, "rank": 1, "decoded_token": "lo"},
        },
    ]


def test_every_choice_of_n_carries_the_prompt_logprobs() -> None:
    """One set per call (the frontend sends it once, before the first token), on each of the n
    choices of a whole reply, as vLLM's completions are."""
    usage = common_pb2.Usage(prompt_tokens=2, completion_tokens=2)
    responses = [
        pb.GenerateResponse(prompt_logprobs=[lp(8, -2.0, "lo")]),
        pb.GenerateResponse(text="a", token_ids=[1], index=0, finish_reason=STOP),
        pb.GenerateResponse(text="b", token_ids=[2], index=1, finish_reason=STOP, usage=usage),
    ]
    body = Reply("m", chat=False).whole(join_chunks(to_chunk(r) for r in responses))
    want = [None, {"8": {"logprob": -2.0, "rank": 1, "decoded_token": "lo"}}]
    assert [c["text"] for c in body["choices"]] == ["a", "b"]
    assert [c["prompt_logprobs"] for c in body["choices"]] == [want, want]


def test_a_tool_call_parse_error_is_an_extra_field_of_the_choice() -> None:
    """The malformed block stays in content; the choice (and the stream event that carries the
    block) says so, as ChatResponse.tool_call_parse_error does."""
    responses = [
        pb.ChatResponse(text="<tool_call>\n{oops}\n</tool_call>", tool_call_parse_error=True),
        pb.ChatResponse(
            token_ids=[1],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=1),
        ),
    ]
    body = Reply("m", chat=True).whole(join_chunks(to_chunk(r) for r in responses))
    (choice,) = body["choices"]
    assert choice["tool_call_parse_error"] is True
    assert choice["message"]["content"] == "<tool_call>\n{oops}\n</tool_call>"
    bodies = asyncio.run(_stream(Reply("m", chat=True), responses))
    flagged = [b["choices"][0].get("tool_call_parse_error") for b in bodies[1:-2]]
    assert flagged == [True, None]


def test_return_token_ids_puts_vllms_token_fields_in_bodies_and_events() -> None:
    """vLLM's return_token_ids: the call asks the frontend for the prompt's ids; completions put
    them on each choice (streamed: its first event), chat in the body (streamed: the first event,
    the role delta). Every choice's token_ids, streamed as deltas, even of a chunk with no text
    (a partial character)."""
    for request, mapper in ((completion(return_token_ids=True), map_completion),
                            (chat(return_token_ids=True), map_chat)):  # fmt: skip
        _, mapped = mapper(request)  # type: ignore[operator]
        assert mapped.token_ids and mapped.call["return_prompt_token_ids"] is True
    _, plain = map_completion(completion())
    assert not plain.token_ids and "return_prompt_token_ids" not in plain.call
    usage = common_pb2.Usage(prompt_tokens=3, completion_tokens=4)
    responses = [
        pb.GenerateResponse(text="a", token_ids=[11], index=1, prompt_token_ids=[7, 8, 9]),
        pb.GenerateResponse(token_ids=[12], index=0),  # held-back text: ids only
        pb.GenerateResponse(text="bc", token_ids=[13], index=0, finish_reason=STOP),
        pb.GenerateResponse(text="d", token_ids=[14], index=1, finish_reason=STOP, usage=usage),
    ]
    whole = join_chunks(to_chunk(r) for r in responses)
    body = Reply("m", chat=False, token_ids=True).whole(whole)
    assert [c["token_ids"] for c in body["choices"]] == [[12, 13], [11, 14]]
    assert [c["prompt_token_ids"] for c in body["choices"]] == [[7, 8, 9]] * 2
    assert "prompt_token_ids" not in Reply("m", chat=False).whole(whole)["choices"][0]
    streamed = asyncio.run(_stream(Reply("m", chat=False, token_ids=True), responses, n=2))
    choices = [b["choices"][0] for b in streamed[:-2]]
    assert [(c["index"], c["token_ids"]) for c in choices] == [(1, [11]), (0, [12]), (0, [13]),
                                                                (1, [14])]  # fmt: skip
    firsts = [c.get("prompt_token_ids") for c in choices]
    assert firsts == [[7, 8, 9], [7, 8, 9], None, None]
    chat_responses = [
        pb.ChatResponse(text="hi", token_ids=[21], prompt_token_ids=[5, 6]),
        pb.ChatResponse(text="!", token_ids=[22], finish_reason=STOP, usage=usage),
    ]
    chat_whole = join_chunks(to_chunk(r) for r in chat_responses)
    body = Reply("m", chat=True, token_ids=True).whole(chat_whole)
    assert body["prompt_token_ids"] == [5, 6] and body["choices"][0]["token_ids"] == [21, 22]
    streamed = asyncio.run(_stream(Reply("m", chat=True, token_ids=True), chat_responses))
    role, *deltas = streamed[:-2]
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert role["prompt_token_ids"] == [5, 6]
    assert [d["choices"][0]["token_ids"] for d in deltas] == [[21], [22]]
    assert all("prompt_token_ids" not in d for d in deltas)


def test_stop_reason_is_vllms_the_stop_string_or_stop_token_never_an_eos() -> None:
    usage = common_pb2.Usage(prompt_tokens=1, completion_tokens=1)
    ends = [
        (pb.GenerateResponse(matched_stop="\n\n"), "\n\n"),
        (pb.GenerateResponse(matched_stop_token_id=42), 42),
        (pb.GenerateResponse(matched_stop_token_id=2), None),  # the model's eos
        (pb.GenerateResponse(finish_reason=common_pb2.FINISH_REASON_LENGTH), None),
    ]
    for end, expected in ends:
        if not end.finish_reason:
            end.finish_reason = STOP
        responses = [pb.GenerateResponse(text="a", token_ids=[1]), end]
        responses[-1].usage.CopyFrom(usage)
        for chat in (False, True):
            reply = Reply("m", chat=chat, eos=frozenset({2}))
            body = reply.whole(join_chunks(to_chunk(r) for r in responses))
            assert body["choices"][0]["stop_reason"] == expected, (end, chat)
            streamed = asyncio.run(_stream(reply, responses))
            choices = [b["choices"][0] for b in streamed[:-2] if b["choices"]]
            assert choices[-1]["stop_reason"] == expected
            assert all("stop_reason" not in c for c in choices[:-1])  # only on the last event
