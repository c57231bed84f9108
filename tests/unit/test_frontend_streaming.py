"""FrontendServicer's streamed output against a fake worker: text and usage, stop strings and stop
tokens, message coalescing (stream_interval), logprobs split across bounded messages."""

import asyncio
from pathlib import Path

import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.text.tokenizer import Tokenizer
from tests.unit.frontend_fakes import MAX_MODEL_LEN, OUTPUT, Harness, _collect, _generate, run


def test_generate_streams_text_and_usage(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        responses = await _collect(
            h.stub.Generate(
                _generate(
                    prompt="Say hi",
                    sampling_params={"max_tokens": 20, "temperature": 0.0, "seed": 7},
                )
            )
        )
        assert "".join(r.text for r in responses) == OUTPUT
        assert [i for r in responses for i in r.token_ids] == h.fake.output_ids
        last = responses[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert all(r.finish_reason == 0 for r in responses[:-1])
        assert (last.usage.prompt_tokens, last.usage.cached_tokens) == (2, 3)
        sent = h.fake.requests[0]
        assert list(sent.prompt_token_ids) == tokenizer.encode("Say hi")
        assert sent.request_id and sent.sampling_params.max_tokens == 20
        assert sent.sampling_params.seed == 7 and sent.sampling_params.HasField("temperature")
        assert h.frontend.servicer.num_in_flight == 0

    run(test, tokenizer, tiny_model_dir)


def test_unset_max_tokens_fills_the_context(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await _collect(h.stub.Generate(_generate(prompt_token_ids=[1, 2, 3])))
        params = h.fake.requests[0].sampling_params
        assert params.max_tokens == MAX_MODEL_LEN - 3 and not params.stop

    run(test, tokenizer, tiny_model_dir)


def test_stop_string_ends_the_worker_call(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.hang_after = 100  # only a stop string can end this request early
        responses = await _collect(
            h.stub.Generate(_generate(prompt="x", sampling_params={"stop": ["end. S", "never"]}))
        )
        assert "".join(r.text for r in responses) == "Hello, 世界! 😀 The "
        last = responses[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_STOP
        assert last.matched_stop == "end. S"
        sent_ids = [i for r in responses for i in r.token_ids]
        assert sent_ids == h.fake.output_ids[: len(sent_ids)]
        assert last.usage.completion_tokens == len(sent_ids) < len(h.fake.output_ids)
        await asyncio.wait_for(h.fake.cancelled.wait(), 2)

    run(test, tokenizer, tiny_model_dir)


def test_stop_token_text_excluded_unless_asked(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        h.fake.stop_token_id = tokenizer.encode("!", add_special_tokens=False)[0]
        responses = await _collect(h.stub.Generate(_generate(prompt="x")))
        assert "".join(r.text for r in responses) == OUTPUT
        assert responses[-1].matched_stop_token_id == h.fake.stop_token_id
        assert responses[-1].token_ids[-1] == h.fake.stop_token_id
        responses = await _collect(
            h.stub.Generate(
                _generate(prompt="x", sampling_params={"include_stop_str_in_output": True})
            )
        )
        assert "".join(r.text for r in responses) == OUTPUT + "!"

    run(test, tokenizer, tiny_model_dir)


def test_detokenize_false_streams_ids_only(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    """SamplingParams.detokenize false: the same ids, finish reason and usage as with text, every
    text field empty (the logprob entries' too); the worker is asked the same."""

    async def test(h: Harness) -> None:
        h.fake.stop_token_id = tokenizer.encode("!", add_special_tokens=False)[0]
        h.fake.logprobs = True
        params = {"logprobs": 1, "max_tokens": 30}
        ids_only = await _collect(
            h.stub.Generate(_generate(prompt="x", sampling_params={**params, "detokenize": False}))
        )
        with_text = await _collect(h.stub.Generate(_generate(prompt="x", sampling_params=params)))
        assert "".join(r.text for r in with_text) == OUTPUT
        assert all(r.text == "" for r in ids_only)
        ids = [i for r in ids_only for i in r.token_ids]
        assert ids == [i for r in with_text for i in r.token_ids]
        assert ids == [*h.fake.output_ids, h.fake.stop_token_id]
        entries = [e for r in ids_only for e in r.logprobs]
        assert [e.token_id for e in entries] == ids
        assert all(e.text == "" and all(t.text == "" for t in e.top_logprobs) for e in entries)
        assert all(e.text for r in with_text for e in r.logprobs)
        for name in ("finish_reason", "matched_stop_token_id", "usage"):
            assert getattr(ids_only[-1], name) == getattr(with_text[-1], name), name
        sent = [r.sampling_params for r in h.fake.requests]
        assert sent[0] == sent[1]  # nothing of it reaches the worker
        assert h.frontend.servicer.num_in_flight == 0

    run(test, tokenizer, tiny_model_dir)


def test_the_prompts_ids_come_on_the_first_message_when_asked(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    async def test(h: Harness) -> None:
        asked = await _collect(
            h.stub.Generate(_generate(prompt="Say hi", return_prompt_token_ids=True))
        )
        assert list(asked[0].prompt_token_ids) == tokenizer.encode("Say hi")
        assert all(not r.prompt_token_ids for r in asked[1:])
        plain = await _collect(h.stub.Generate(_generate(prompt="Say hi")))
        assert all(not r.prompt_token_ids for r in plain)
        messages = [frontend_pb2.ChatMessage(role="user", content="Hi")]
        chat = await _collect(
            h.stub.Chat(
                frontend_pb2.ChatRequest(
                    messages=messages, enable_thinking=False, return_prompt_token_ids=True
                )
            )
        )
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}], enable_thinking=False
        )
        assert list(chat[0].prompt_token_ids) == list(h.fake.requests[-1].prompt_token_ids)
        assert list(chat[0].prompt_token_ids) == tokenizer.encode(rendered, False)
        assert all(not r.prompt_token_ids for r in chat[1:])

    run(test, tokenizer, tiny_model_dir)


def test_stream_interval_coalesces_after_the_first_token(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    async def test(h: Harness) -> None:
        responses = await _collect(h.stub.Generate(_generate(prompt="x")))
        sizes = [len(r.token_ids) for r in responses]
        assert sizes[0] == 2  # the first message goes out at once (the fake sends 2 ids a time)
        assert all(size >= 6 for size in sizes[1:-1]), sizes
        assert sum(sizes) == len(h.fake.output_ids)
        assert "".join(r.text for r in responses) == OUTPUT

    run(test, tokenizer, tiny_model_dir, stream_interval=6)


def test_a_requests_stream_interval_overrides_the_frontends(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    """GenerateRequest.stream_interval: this call's messages wait for 6 ids, on a frontend whose
    --stream-interval is 1; a call without it keeps the frontend's."""

    async def test(h: Harness) -> None:
        batched = await _collect(h.stub.Generate(_generate(prompt="x", stream_interval=6)))
        sizes = [len(r.token_ids) for r in batched]
        assert sizes[0] == 2 and all(size >= 6 for size in sizes[1:-1]), sizes
        assert "".join(r.text for r in batched) == OUTPUT
        plain = await _collect(h.stub.Generate(_generate(prompt="x")))
        assert len(plain) > len(batched) and "".join(r.text for r in plain) == OUTPUT

    run(test, tokenizer, tiny_model_dir, stream_interval=1)


@pytest.mark.parametrize("stop", [None, "STOP"])
def test_logprobs_split_across_bounded_messages(
    tokenizer: Tokenizer, tiny_model_dir: Path, stop: str | None
) -> None:
    """Prompt entries go first in messages of at most max_logprobs_per_message entries, then ids
    with one entry each (a backlog of ids is split too: stream_interval lets them pile up)."""
    prompt = "one two three four five six seven eight nine ten"
    prompt_ids = tokenizer.encode(prompt)

    async def test(h: Harness) -> None:
        h.fake.logprobs = True
        params = {"logprobs": 1, "prompt_logprobs": 1, "stop": [stop] if stop else []}
        call = h.stub.Generate(_generate(prompt=prompt, sampling_params=params))
        responses = await _collect(call)
        for r in responses:
            assert len(r.logprobs) + len(r.prompt_logprobs) <= 3, r
            assert len(r.logprobs) == len(r.token_ids)  # one entry per id
            assert [e.token_id for e in r.logprobs] == list(r.token_ids)
            assert all(e.text == tokenizer.token_texts([e.token_id])[0] for e in r.logprobs)
        prompt_messages = [r for r in responses if r.prompt_logprobs]
        assert all(not r.token_ids and not r.text for r in prompt_messages[:-1])
        joined = [e.token_id for r in responses for e in r.prompt_logprobs]
        assert joined == prompt_ids[1:]
        text = "".join(r.text for r in responses)
        ids = [i for r in responses for i in r.token_ids]
        expected = OUTPUT[: OUTPUT.index(stop)] if stop else OUTPUT
        assert text == expected
        assert max(len(r.token_ids) for r in responses) == 3  # the backlog of 8 ids was split
        assert [e.token_id for r in responses for e in r.logprobs] == ids
        assert responses[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
        if stop is None:
            assert ids == h.fake.output_ids

    run(test, tokenizer, tiny_model_dir, max_logprobs_per_message=3, stream_interval=8)
