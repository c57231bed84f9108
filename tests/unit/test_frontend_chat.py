"""FrontendServicer's Chat against a fake worker: the chat template, model info and Tokenize, tool
calls and reasoning split out of the reply."""

import json
import shutil
from pathlib import Path

import grpc
import grpc.aio
import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.text.tokenizer import Tokenizer
from nanoserve.tiny.tokenizer import CHAT_TEMPLATE
from tests.unit import frontend_fakes
from tests.unit.frontend_fakes import (
    IM_END_ID,
    MAX_MODEL_LEN,
    OUTPUT,
    VOCAB_SIZE,
    Harness,
    _collect,
    run,
)


def test_chat_model_info_tokenize(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        messages = [
            frontend_pb2.ChatMessage(role="system", content="Be brief."),
            frontend_pb2.ChatMessage(role="user", content="Hi"),
        ]
        responses = await _collect(
            h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, enable_thinking=False))
        )
        assert isinstance(responses[-1], frontend_pb2.ChatResponse)
        assert "".join(r.text for r in responses) == OUTPUT
        expected = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], enable_thinking=False
        )
        assert "<think>" in expected and expected.endswith("</think>\n\n")
        assert list(h.fake.requests[0].prompt_token_ids) == tokenizer.encode(expected, False)
        info = await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert (info.model_name, info.max_model_len, info.vocab_size) == (
            "fake",
            MAX_MODEL_LEN,
            VOCAB_SIZE,
        )
        assert list(info.eos_token_ids) == [IM_END_ID] and info.has_chat_template
        response = await h.stub.Tokenize(frontend_pb2.TokenizeRequest(text="<|im_end|>"))
        assert list(response.token_ids) == [IM_END_ID]

    run(test, tokenizer, tiny_model_dir)


RECORDED_TOOL_REPLY = (  # a Qwen3 reply: reasoning, a sentence, two calls (the worker sends ids)
    "<think>\nThe user wants the weather in two cities.\n</think>\n\nLet me check both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>'
)


def test_chat_tools_and_reasoning(
    tokenizer: Tokenizer, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the servicer: tools reach the prompt, the reply's ids (streamed two at a time) come
    back split into reasoning_content, text and structured tool_calls; finish_reason TOOL_CALLS.
    With parallel_tool_calls false, only the first call."""
    monkeypatch.setattr(frontend_fakes, "MAX_MODEL_LEN", 4096)  # room for the tools' prompt
    tool = frontend_pb2.Tool(
        type="function",
        function=frontend_pb2.ToolFunction(
            name="get_weather", parameters='{"type": "object", "properties": {}}'
        ),
    )
    messages = [frontend_pb2.ChatMessage(role="user", content="Weather in Paris and Tokyo?")]

    async def test(h: Harness) -> None:
        h.fake.output_ids = tokenizer.encode(RECORDED_TOOL_REPLY, add_special_tokens=False)
        h.fake.stop_token_id = IM_END_ID
        request = frontend_pb2.ChatRequest(messages=messages, tools=[tool], separate_reasoning=True)
        responses = await _collect(h.stub.Chat(request))
        assert len(responses) > 5  # streamed
        assert "".join(r.reasoning_content for r in responses) == (
            "The user wants the weather in two cities."
        )
        assert "".join(r.text for r in responses) == "Let me check both."
        calls = [c for r in responses for c in r.tool_calls]
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("get_weather", '{"city": "Paris"}'),
            ("get_weather", '{"city": "東京"}'),
        ]
        assert len({c.id for c in calls}) == 2 and all(c.type == "function" for c in calls)
        assert sum(bool(r.tool_calls) for r in responses) == 2  # each sent once, when complete
        assert not any(r.tool_call_parse_error for r in responses)
        assert responses[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": messages[0].content}],
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ],
        )
        assert "<tools>" in expected
        assert list(h.fake.requests[-1].prompt_token_ids) == tokenizer.encode(expected, False)

        # parallel_tool_calls false ("auto"): the first call only, the second never sent
        request.parallel_tool_calls = False
        single = await _collect(h.stub.Chat(request))
        assert "".join(r.text for r in single) == "Let me check both."
        calls = [c for r in single for c in r.tool_calls]
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("get_weather", '{"city": "Paris"}')
        ]
        assert single[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS

        # tool_choice "none": no tools in the prompt, the reply's text untouched
        plain = await _collect(
            h.stub.Chat(
                frontend_pb2.ChatRequest(messages=messages, tools=[tool], tool_choice="none")
            )
        )
        assert "".join(r.text for r in plain) == RECORDED_TOOL_REPLY
        assert not any(r.tool_calls or r.reasoning_content for r in plain)
        assert plain[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        bare = tokenizer.apply_chat_template([{"role": "user", "content": messages[0].content}])
        assert list(h.fake.requests[-1].prompt_token_ids) == tokenizer.encode(bare, False)

        # a malformed block stays text, flagged
        h.fake.output_ids = tokenizer.encode('<tool_call>\n{"name": oops}\n</tool_call>', False)
        bad = await _collect(h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, tools=[tool])))
        assert "".join(r.text for r in bad) == '<tool_call>\n{"name": oops}\n</tool_call>'
        assert any(r.tool_call_parse_error for r in bad) and not any(r.tool_calls for r in bad)
        assert bad[-1].finish_reason == common_pb2.FINISH_REASON_STOP

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _collect(
                h.stub.Chat(frontend_pb2.ChatRequest(messages=messages, tool_choice="any"))
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tool_choice" in e.value.details()

    run(test, tokenizer, tiny_model_dir)


def test_chat_reasoning_opened_by_the_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A template that opens the think block in the prompt (as Qwen3's thinking-only models do):
    the reply has no opening tag and starts as reasoning; cut by max_tokens before </think>, all
    of it is reasoning."""
    opened = CHAT_TEMPLATE.replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    )
    assert opened != CHAT_TEMPLATE
    shutil.copyfile(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": opened}))
    tokenizer = Tokenizer(tmp_path)
    messages = [frontend_pb2.ChatMessage(role="user", content="2+2?")]

    async def test(h: Harness) -> None:
        h.fake.output_ids = tokenizer.encode("Add them.\n</think>\n\n4", False)
        h.fake.stop_token_id = IM_END_ID
        request = frontend_pb2.ChatRequest(messages=messages, separate_reasoning=True)
        done = await _collect(h.stub.Chat(request))
        assert "".join(r.reasoning_content for r in done) == "Add them."
        assert "".join(r.text for r in done) == "4"
        assert done[-1].finish_reason == common_pb2.FINISH_REASON_STOP

        h.fake.output_ids = tokenizer.encode("Add them, then", False)
        h.fake.stop_token_id = None
        cut = await _collect(h.stub.Chat(request))
        assert "".join(r.reasoning_content for r in cut) == "Add them, then"
        assert "".join(r.text for r in cut) == ""
        assert cut[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

        plain = await _collect(h.stub.Chat(frontend_pb2.ChatRequest(messages=messages)))
        assert "".join(r.text for r in plain) == "Add them, then"  # off: text unchanged

    try:
        run(test, tokenizer, tmp_path)
    finally:
        tokenizer.close()
