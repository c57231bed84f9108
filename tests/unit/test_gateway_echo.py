"""The gateway's echo, best_of and suffix on /v1/completions: their mapping onto the gRPC request,
and recorded gRPC responses -> echoed chunks, the best_of choices and the OpenAI bodies."""

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

pytest.importorskip("fastapi", reason="the gateway extra: pip install 'nanoserve[gateway]'")

from nanoserve.client.messages import Chunk, Detokenized, join_chunks, to_chunk
from nanoserve.errors import error_for_code
from nanoserve.frontend.gateway.best_of import keep_best
from nanoserve.frontend.gateway.completion_params import BestOf, Echo
from nanoserve.frontend.gateway.echo import echo_chunks
from nanoserve.frontend.gateway.errors import OpenAIError, from_service_error
from nanoserve.frontend.gateway.params import map_completion
from nanoserve.frontend.gateway.protocol import CompletionRequest
from nanoserve.frontend.gateway.responses import Reply
from nanoserve.frontend.gateway.stream import StreamShaper, events
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as pb

STOP, LENGTH = common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hi there", **fields})


def lp(token_id: int, logprob: float, text: str, top=()) -> common_pb2.TokenLogprobs:
    alternatives = [common_pb2.TokenLogprob(token_id=i, logprob=p, text=t) for i, p, t in top]
    return common_pb2.TokenLogprobs(
        token_id=token_id, logprob=logprob, rank=1, text=text, top_logprobs=alternatives
    )


class FakeClient:
    """The AsyncClient call echo.py makes for a token-id prompt: Detokenize."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts
        self.prompts: list[Sequence[int]] = []

    async def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool) -> Detokenized:
        self.prompts.append(token_ids)
        assert skip_special_tokens is False
        pieces = [self.texts[i] for i in token_ids]
        return Detokenized("".join(pieces), pieces)


async def _iterate(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def echoed(echo: Echo | None, responses: list, client: FakeClient | None = None) -> list[Chunk]:
    async def run() -> list[Chunk]:
        chunks = _iterate([to_chunk(r) for r in responses])
        if echo is not None:
            chunks = echo_chunks(echo, chunks, client or FakeClient({}))  # type: ignore[arg-type]
        return [c async for c in chunks]

    return asyncio.run(run())


def streamed(reply: Reply, chunks: list[Chunk], n: int = 1) -> list[dict]:
    async def run() -> list[dict]:
        shaper = StreamShaper(reply, n)
        return [
            json.loads(e[6:])
            async for e in events(shaper, chunks[0], _iterate(chunks[1:]), {})
            if e != b"data: [DONE]\n\n"
        ]

    return asyncio.run(run())


# A recorded Generate call for the prompt "Hi there" (tokens "Hi", " there") with prompt_logprobs
# and logprobs 1: the prompt's entries come in their own message (a long prompt's would), then
# the tokens " you" and "!".
PROMPT_ENTRIES = [lp(11, -2.5, " there", [(12, -0.5, " you")])]
RESPONSES = [
    pb.GenerateResponse(prompt_logprobs=PROMPT_ENTRIES),
    pb.GenerateResponse(text=" you", token_ids=[12], logprobs=[lp(12, -0.5, " you", [(12, -0.5, " you")])]),
    pb.GenerateResponse(
        text="!", token_ids=[13], finish_reason=LENGTH, logprobs=[lp(13, -1.0, "!", [(14, -0.9, ".")])],
        usage=common_pb2.Usage(prompt_tokens=2, completion_tokens=2),
    ),
]  # fmt: skip


def test_echo_maps_onto_prompt_logprobs_and_max_tokens_0_onto_one_token() -> None:
    _, mapped = map_completion(completion(echo=True, logprobs=2))
    # max_tokens 16: /v1/completions' default when the body leaves it out
    assert mapped.sampling == {"logprobs": 2, "prompt_logprobs": 2, "max_tokens": 16}
    assert mapped.echo == Echo("Hi there", 2, None, False)
    assert mapped.param_names["sampling_params.prompt_logprobs"] == "logprobs"
    _, mapped = map_completion(completion(echo=True, max_tokens=0))
    assert mapped.sampling == {"max_tokens": 1} and mapped.echo is not None
    assert mapped.echo.no_tokens
    # a token-id prompt's text comes from Detokenize: no prompt entries (the prefix cache still
    # serves it); the client's own k is kept
    _, mapped = map_completion(completion(echo=True, prompt=[[5, 6]]))
    assert mapped.sampling == {"max_tokens": 16} and mapped.echo == Echo([5, 6])
    _, mapped = map_completion(completion(echo=True, logprobs=1, prompt_logprobs=3))
    assert mapped.sampling["prompt_logprobs"] == 3 and mapped.echo == Echo("Hi there", 1, 3)
    _, mapped = map_completion(completion(echo=True, logprobs=4, prompt_logprobs=3))
    assert mapped.sampling["prompt_logprobs"] == 4
    # max_tokens 0 without echo stays 0: the frontend refuses it, naming max_tokens
    assert map_completion(completion(max_tokens=0))[1].sampling == {"max_tokens": 0}


def test_best_of_maps_onto_n_with_logprobs_to_rank_them() -> None:
    _, mapped = map_completion(completion(best_of=3, seed=7))
    assert mapped.sampling == {"seed": 7, "n": 3, "logprobs": 0, "max_tokens": 16}
    assert mapped.best_of == BestOf(3, 1, True) and mapped.n == 1 and not mapped.logprobs
    refused = error_for_code(grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.n: too many")
    assert from_service_error(refused, mapped.param_names).param == "best_of"
    _, mapped = map_completion(completion(best_of=4, n=2, logprobs=1))
    assert mapped.sampling == {"n": 4, "logprobs": 1, "max_tokens": 16}
    assert mapped.best_of == BestOf(4, 2, False)
    for fields in ({"best_of": 2, "n": 2}, {"best_of": 2, "n": 2, "stream": True}):
        _, mapped = map_completion(completion(**fields))
        assert mapped.best_of is None and mapped.sampling == {"n": 2, "max_tokens": 16}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"best_of": 1, "n": 2}, "must be >= n (2)"),
        ({"best_of": 17}, "must be <= 16"),
        ({"best_of": 2, "stream": True}, "cannot be streamed"),
        ({"suffix": "x"}, "fill-in-the-middle"),
        ({"echo": True, "max_tokens": 0, "min_tokens": 1}, "must be 0 with max_tokens 0"),
    ],
)
def test_what_echo_best_of_and_suffix_cannot_do_is_a_400_saying_why(
    fields: dict, words: str
) -> None:
    with pytest.raises(OpenAIError) as raised:
        map_completion(completion(**fields))
    param = next(iter(f for f in ("min_tokens", "suffix", "best_of") if f in fields))
    assert raised.value.status == 400 and raised.value.param == param
    assert words in raised.value.message


def test_echo_with_logprobs_puts_the_prompt_first_with_a_null_first_logprob() -> None:
    echo = Echo("Hi there", logprobs=1)
    body = Reply("m", chat=False, logprobs=True).whole(join_chunks(echoed(echo, RESPONSES)))
    (choice,) = body["choices"]
    assert choice["text"] == "Hi there you!" and "prompt_logprobs" not in choice
    legacy = choice["logprobs"]
    assert legacy["tokens"] == ["Hi", " there", " you", "!"]
    assert legacy["token_logprobs"] == [None, -2.5, -0.5, -1.0]
    assert legacy["top_logprobs"] == [None, {" you": -0.5, " there": -2.5}, {" you": -0.5},
                                      {".": pytest.approx(-0.9), "!": -1.0}]  # fmt: skip
    assert legacy["text_offset"] == [0, 2, 8, 12]
    for token, offset in zip(legacy["tokens"], legacy["text_offset"], strict=True):
        assert choice["text"][offset:].startswith(token)
    assert body["usage"]["prompt_tokens"] == 2 and body["usage"]["completion_tokens"] == 2
    # without logprobs only the text is echoed; the client's own prompt_logprobs stay vLLM's list
    plain = join_chunks(echoed(Echo("Hi there"), RESPONSES))
    assert plain.text == "Hi there you!" and [e.text for e in plain.logprobs or ()] == [" you", "!"]
    own = Echo("Hi there", logprobs=1, prompt_logprobs=0)
    body = Reply("m", chat=False, logprobs=True).whole(join_chunks(echoed(own, RESPONSES)))
    assert body["choices"][0]["prompt_logprobs"] == [
        None,
        {"11": {"logprob": -2.5, "rank": 1, "decoded_token": " there"}},
    ]


def test_echo_with_max_tokens_0_scores_the_prompt_and_drops_the_token() -> None:
    responses = [
        pb.GenerateResponse(
            text=" you", token_ids=[12], finish_reason=STOP, matched_stop_token_id=12,
            prompt_logprobs=PROMPT_ENTRIES, logprobs=[lp(12, -0.5, " you")],
            usage=common_pb2.Usage(prompt_tokens=2, completion_tokens=1),
        ),
    ]  # fmt: skip
    echo = Echo("Hi there", logprobs=0, no_tokens=True)
    body = Reply("m", chat=False, logprobs=True).whole(join_chunks(echoed(echo, responses)))
    (choice,) = body["choices"]
    assert choice["text"] == "Hi there" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["Hi", " there"]
    assert choice["logprobs"]["token_logprobs"] == [None, -2.5]
    assert choice["logprobs"]["top_logprobs"] == [None, {" there": -2.5}]  # trimmed to k=0
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == 2


def test_a_token_id_prompt_echoes_its_tokens_texts() -> None:
    client = FakeClient({10: "Hi", 11: " there"})
    chunks = echoed(Echo([10, 11], logprobs=1), RESPONSES, client)
    whole = Reply("m", chat=False, logprobs=True).whole(join_chunks(chunks))
    assert client.prompts == [[10, 11]]
    assert whole["choices"][0]["text"] == "Hi there you!"
    assert whole["choices"][0]["logprobs"]["tokens"][:2] == ["Hi", " there"]
    plain = echoed(Echo([10, 11]), RESPONSES, FakeClient({10: "Hi", 11: " there"}))
    assert join_chunks(plain).text == "Hi there you!" and join_chunks(plain).logprobs is not None


def test_a_streamed_echo_sends_the_prompt_in_each_choices_first_event() -> None:
    usage = common_pb2.Usage(prompt_tokens=2, completion_tokens=3)
    responses = [
        pb.GenerateResponse(prompt_logprobs=PROMPT_ENTRIES),
        pb.GenerateResponse(text=" you", token_ids=[12], index=0, logprobs=[lp(12, -0.5, " you")]),
        pb.GenerateResponse(text=" all", token_ids=[15], index=1, logprobs=[lp(15, -0.7, " all")]),
        pb.GenerateResponse(text="!", token_ids=[13], index=0, finish_reason=STOP,
                            logprobs=[lp(13, -1.0, "!")]),
        pb.GenerateResponse(index=1, finish_reason=STOP, usage=usage),
    ]  # fmt: skip
    echo = Echo("Hi there", logprobs=0)
    chunks = echoed(echo, responses)
    reply = Reply("m", chat=False, logprobs=True)
    events_ = streamed(reply, chunks, n=2)
    firsts = {}
    texts: dict[int, str] = {}
    offsets: dict[int, list[int]] = {}
    for event in events_:
        (c,) = event["choices"]
        firsts.setdefault(c["index"], c)
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        offsets.setdefault(c["index"], []).extend((c["logprobs"] or {}).get("text_offset", []))
    assert firsts[0]["text"] == "Hi there you" and firsts[1]["text"] == "Hi there all"
    assert firsts[1]["logprobs"]["token_logprobs"] == [None, -2.5, pytest.approx(-0.7)]
    assert texts == {0: "Hi there you!", 1: "Hi there all"}
    assert offsets[0] == [0, 2, 8, 12]
    whole = reply.whole(join_chunks(chunks))
    assert [c["text"] for c in whole["choices"]] == [texts[0], texts[1]]
    assert whole["choices"][0]["logprobs"]["text_offset"] == offsets[0]


def _three_completions() -> list[pb.GenerateResponse]:
    """n=3 with logprobs 0: completion 1 has the highest sum (-0.5), then 2 (-1.0), then 0."""
    usage = common_pb2.Usage(prompt_tokens=2, completion_tokens=5)
    return [
        pb.GenerateResponse(text="a", token_ids=[1], index=0, logprobs=[lp(1, -0.2, "a")]),
        pb.GenerateResponse(text="b", token_ids=[2], index=1, logprobs=[lp(2, -0.2, "b")]),
        pb.GenerateResponse(text="c", token_ids=[3], index=2, logprobs=[lp(3, -1.0, "c")]),
        pb.GenerateResponse(text="d", token_ids=[4], index=0, finish_reason=STOP,
                            logprobs=[lp(4, -2.0, "d")]),
        pb.GenerateResponse(text="e", token_ids=[5], index=1, finish_reason=STOP,
                            logprobs=[lp(5, -0.3, "e")]),
        pb.GenerateResponse(index=2, finish_reason=STOP, usage=usage),
    ]  # fmt: skip


def test_best_of_keeps_the_highest_cumulative_logprobs_and_counts_every_token() -> None:
    whole = join_chunks(to_chunk(r) for r in _three_completions())
    body = Reply("m", chat=False).whole(keep_best(whole, BestOf(3, 1, strip_logprobs=True)))
    (choice,) = body["choices"]
    assert choice["text"] == "be" and choice["index"] == 0 and choice["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 5  # all three completions' tokens
    two = keep_best(whole, BestOf(3, 2, strip_logprobs=False))
    assert [c.text for c in two.choices] == ["be", "c"]
    body = Reply("m", chat=False, logprobs=True).whole(two)
    assert body["choices"][1]["logprobs"]["tokens"] == ["c"]


def test_best_of_with_echo_ranks_by_the_generated_tokens_only() -> None:
    responses = [pb.GenerateResponse(prompt_logprobs=PROMPT_ENTRIES), *_three_completions()]
    chunks = echoed(Echo("Hi there", logprobs=0), responses)
    best = keep_best(join_chunks(chunks), BestOf(3, 1, strip_logprobs=False))
    assert best.text == "Hi therebe" and best.choices == ()
    assert [e.text for e in best.logprobs or ()] == ["Hi", " there", "b", "e"]
