"""The gateway's request mapping (OpenAI body -> gRPC client arguments), its error mapping (gRPC
status -> OpenAI error body and HTTP status) and its body-size limit, without any service."""

import asyncio

import grpc
import pytest

pytest.importorskip("fastapi", reason="the gateway extra: pip install 'nanoserve[gateway]'")

from pydantic import ValidationError

from nanoserve.client.requests import sampling_params as client_sampling_params
from nanoserve.errors import InvalidArgument, error_for_code
from nanoserve.frontend.gateway.body_limit import BodyLimit, BodyTooLarge
from nanoserve.frontend.gateway.errors import (
    STATUS_BY_CODE,
    OpenAIError,
    from_service_error,
)
from nanoserve.frontend.gateway.params import (
    NOT_YET,
    SAMPLING,
    map_chat,
    map_completion,
)
from nanoserve.frontend.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from nanoserve.proto.v1 import common_pb2


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields})


def chat(**fields) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "Hi"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})


def test_every_sampling_target_is_a_sampling_params_field() -> None:
    fields = set(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)
    assert set(SAMPLING.values()) <= fields
    assert not set(SAMPLING) & set(NOT_YET)


def test_openai_and_vllm_parameters_map_onto_sampling_params() -> None:
    given = {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": "END",
        "presence_penalty": 0.1,
        "frequency_penalty": -0.2,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "stop_token_ids": [5, 6],
    }
    prompt, mapped = map_completion(completion(**given))
    assert prompt == "Hi"
    assert mapped.sampling == given  # shapes (one stop string) are the client's to convert
    common_pb2.SamplingParams(**mapped.sampling)  # every value fits its proto field
    assert mapped.param_names["sampling_params.max_tokens"] == "max_tokens"
    assert not mapped.stream and not mapped.include_usage


def test_stop_list_stream_options_and_token_prompts() -> None:
    prompt, mapped = map_completion(
        completion(
            prompt=[1, 2, 3], stop=["a", "b"], stream=True, stream_options={"include_usage": True}
        )
    )
    assert prompt == [1, 2, 3] and mapped.sampling == {"stop": ["a", "b"], "max_tokens": 16}
    assert mapped.stream and mapped.include_usage
    assert map_completion(completion(prompt=["one"]))[0] == "one"
    assert map_completion(completion(prompt=[[4, 5]]))[0] == [4, 5]


def test_chat_maps_messages_parts_thinking_and_max_completion_tokens() -> None:
    request = chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        max_completion_tokens=9,
        chat_template_kwargs={"enable_thinking": False},
    )
    messages, mapped = map_chat(request)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]
    assert mapped.call == {"enable_thinking": False} and mapped.sampling == {"max_tokens": 9}
    assert mapped.param_names["sampling_params.max_tokens"] == "max_completion_tokens"
    assert map_chat(chat())[1].call == {}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"suffix": "x"}, "suffix"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "structural_tag"}}, "response_format.format"),
        ({"response_format": {"type": "text", "format": {}}}, "response_format.format"),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
            "guided_regex",
        ),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[1, "x"]]}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_the_grpc_api_lacks_is_a_400_naming_it(fields: dict, param: str) -> None:
    with pytest.raises(OpenAIError) as raised:
        map_completion(completion(**fields))
    assert raised.value.status == 400 and raised.value.param == param
    assert raised.value.body()["error"]["param"] == param


def test_no_op_values_of_missing_parameters_are_served() -> None:
    _, mapped = map_completion(completion(best_of=1, echo=False, suffix="", logprobs=None))
    assert mapped.sampling == {"max_tokens": 16}  # the completions default, nothing else
    assert mapped.echo is None and mapped.best_of is None
    _, mapped = map_chat(chat(logprobs=False, response_format={"type": "text"}, tools=[]))
    assert mapped.sampling == {} and mapped.call == {}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
NAMED = {"type": "function", "function": {"name": "f"}}


def test_chat_maps_forced_tool_choices() -> None:
    _, mapped = map_chat(chat(tools=[TOOL], tool_choice="required"))
    assert mapped.call["tool_choice"] == "required" and "tool_choice_function" not in mapped.call
    _, mapped = map_chat(chat(tools=[TOOL], tool_choice=NAMED, parallel_tool_calls=False))
    assert mapped.call["tool_choice_function"] == "f" and "tool_choice" not in mapped.call
    # the frontend's errors name its fields; the caller sent tool_choice
    assert mapped.param_names["tool_choice_function"] == "tool_choice"
    assert map_chat(chat(tool_choice="none"))[1].call == {"tool_choice": "none"}


@pytest.mark.parametrize("choice", [None, "auto", "none", "required", NAMED])
@pytest.mark.parametrize("parallel", [False, True])
def test_chat_maps_parallel_tool_calls_for_every_tool_choice(choice, parallel) -> None:
    fields = {"tools": [TOOL], "parallel_tool_calls": parallel}
    if choice is not None:
        fields["tool_choice"] = choice
    _, mapped = map_chat(chat(**fields))
    assert mapped.call["parallel_tool_calls"] is parallel
    assert mapped.param_names["parallel_tool_calls"] == "parallel_tool_calls"
    assert "parallel_tool_calls" not in map_chat(chat(tools=[TOOL]))[1].call  # unset: the default
    # without tools too: OpenAI accepts it, and it changes nothing
    assert map_chat(chat(parallel_tool_calls=False))[1].call == {"parallel_tool_calls": False}


def test_logit_bias_and_allowed_token_ids_map_on_both_endpoints() -> None:
    fields = {"logit_bias": {"5": 100, "17": -100.0}, "allowed_token_ids": [5, 17, 30]}
    for _, mapped in (map_completion(completion(**fields)), map_chat(chat(**fields))):
        mapped.sampling.pop("max_tokens", None)  # the completions default
        assert mapped.sampling == fields  # OpenAI's shapes: the client's sampling_proto converts
        params = client_sampling_params(**mapped.sampling)
        assert dict(params.logit_bias) == {5: 100.0, 17: -100.0}
        assert mapped.param_names["sampling_params.logit_bias"] == "logit_bias"
    _, mapped = map_completion(completion(logit_bias={}))  # OpenAI's default: no bias
    assert not client_sampling_params(**mapped.sampling).logit_bias


@pytest.mark.parametrize("bias", [{"x": 5}, {"-1": 5}, {"4294967296": 5}])
def test_logit_bias_keys_that_are_no_token_ids_are_a_400_naming_it(bias: dict) -> None:
    _, mapped = map_completion(completion(logit_bias=bias))
    with pytest.raises(InvalidArgument) as refused:  # the client's message cannot hold them
        client_sampling_params(**mapped.sampling)
    error = from_service_error(refused.value, mapped.param_names)
    assert error.status == 400 and error.param == "logit_bias", error.message


def test_chat_refuses_unknown_tools_images_and_both_max_tokens() -> None:
    for fields, param in (
        ({"tool_choice": NAMED}, "tool_choice"),  # no tools
        ({"tools": [TOOL], "tool_choice": {**NAMED, "function": {"name": "g"}}}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "assistant", "audio": {}}]}, "messages[0].audio"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ):
        with pytest.raises(OpenAIError) as raised:
            map_chat(chat(**fields))
        assert raised.value.param == param, fields


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 2**31},
        {"seed": 2**63},
        {"stop": ["x"] * 257},
        {"frobnicate": 1},
        {"chat_template_kwargs": {"unknown": True}},
        {"messages": []},
        {"top_logprobs": 21},
        {"n": -1},
        {"priority": 2**31},
        {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        {"response_format": {"type": "xml"}},
        {"tool_choice": "any"},
        {"tool_choice": {"type": "function"}},
        {"tool_choice": {"type": "allowed_tools", "function": {"name": "f"}}},
        {"logit_bias": {"5": "much"}},
        {"logit_bias": {str(i): 1 for i in range(1025)}},
        {"allowed_token_ids": []},
        {"allowed_token_ids": [-1]},
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {}}]}]},
    ],
)
def test_pydantic_refuses_out_of_range_and_unknown_fields(fields: dict) -> None:
    with pytest.raises(ValidationError):
        chat(**fields)


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error"),
        (grpc.StatusCode.UNAUTHENTICATED, 401, "authentication_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "rate_limit_error"),
        (grpc.StatusCode.UNAVAILABLE, 503, "service_unavailable_error"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "timeout_error"),
        (grpc.StatusCode.INTERNAL, 500, "internal_error"),
        (grpc.StatusCode.UNKNOWN, 500, "internal_error"),
        (grpc.StatusCode.DATA_LOSS, 500, "internal_error"),
    ],
)
def test_grpc_status_maps_to_http_status_and_openai_type(
    code: grpc.StatusCode, status: int, kind: str
) -> None:
    service_error = error_for_code(code, "the details")  # as the client raises it
    error = from_service_error(service_error)
    assert (error.status, error.type) == (status, kind)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert error.code == service_error.code.name.lower()
    # a bug's details stay on the server
    assert ("the details" in error.message) == (status < 500 or status in (503, 504))
    assert STATUS_BY_CODE.get(code, (500, "internal_error")) == (status, kind)


def test_invalid_argument_names_the_openai_parameter_the_caller_sent() -> None:
    names = {"sampling_params.max_tokens": "max_completion_tokens", "prompt_token_ids": "prompt"}
    for details, param in (
        ("sampling_params.max_tokens: must be >= 1, got 0", "max_completion_tokens"),
        ("sampling_params.stop[1]: must not be empty", "stop[1]"),
        ("sampling_params.top_k: must be -1", "top_k"),
        ("messages[2].role: must be one of", "messages[2].role"),
        ("prompt_token_ids[3]: token id 99 >= vocab_size 10", "prompt[3]"),
        ("worker: sampling_params.seed: bad", "seed"),
        ("sampling_params.logit_bias: the bias of token 5 must be", "logit_bias"),
        ("worker: logit_bias: token id 9 is outside the vocabulary", "logit_bias"),
        ("sampling_params.allowed_token_ids[1]: token id 99", "allowed_token_ids[1]"),
        ("nothing to name here", None),
    ):
        error = from_service_error(error_for_code(grpc.StatusCode.INVALID_ARGUMENT, details), names)
        assert error.param == param, details


def run_limited(max_bytes: int, headers: list, chunks: list[bytes]) -> tuple[list[dict], list]:
    """Runs BodyLimit around an app that reads the whole body; returns (sent messages, errors)."""
    sent: list[dict] = []
    errors: list = []
    queue = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict:
        return queue.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send) -> None:
        try:
            while (await receive()).get("more_body"):
                pass
        except BodyTooLarge as e:
            errors.append(e)
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    scope = {"type": "http", "headers": headers}
    asyncio.run(BodyLimit(app, max_bytes)(scope, receive, send))
    return sent, errors


def test_body_limit_by_content_length_and_by_counted_chunks() -> None:
    sent, _ = run_limited(1024, [(b"content-length", b"4096")], [b"x" * 4096])
    assert sent[0]["status"] == 413 and b"request_too_large" in sent[1]["body"]
    sent, errors = run_limited(1024, [], [b"x" * 600, b"x" * 600])  # chunked: no length
    assert sent[0]["status"] == 413 and errors and errors[0].status_code == 413
    sent, _ = run_limited(1024, [(b"content-length", b"1000")], [b"x" * 500, b"x" * 500])
    assert sent[0]["status"] == 200


def test_completions_default_to_16_tokens_and_chat_to_the_context() -> None:
    """Issue 32: /v1/completions without max_tokens gets OpenAI's and vLLM's 16, not the rest of
    the context; a given max_tokens is kept; chat leaves it unset (the frontend fills the context)."""
    assert map_completion(completion())[1].sampling["max_tokens"] == 16
    assert map_completion(completion(max_tokens=3))[1].sampling["max_tokens"] == 3
    assert "max_tokens" not in map_chat(chat())[1].sampling
