"""Logprobs through the real frontend and worker: Generate with logprobs and prompt_logprobs returns
them with token text, equal to the offline engine's, and so do Chat and the worker's GenerateTokens;
a request without them carries none; k > 20 is INVALID_ARGUMENT naming the field."""

import math
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.client.messages import join_chunks
from nanoserve.errors import InvalidArgument
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.worker import SamplingParams
from tests.e2e.processes import Pair, start_pair
from tests.top_logprobs import assert_same_top

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"
# served and offline engines run the same math in other thread counts and batch shapes: float noise
TOL = 1e-4


def test_generate_returns_logprobs_with_text(services, offline_llm, tokenizer) -> None:
    with Client(services.frontend.address, timeout=60) as client:
        prompt_ids = client.tokenize(PROMPT)
        got = client.generate(
            PROMPT, temperature=0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=2
        )
        plain = client.generate(PROMPT, temperature=0, max_tokens=8, ignore_eos=True)
    want = offline_llm.generate(
        [prompt_ids],
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=2),
        use_tqdm=False,
    )[0]
    assert got.token_ids == want.token_ids == plain.token_ids
    assert got.logprobs is not None and len(got.logprobs) == len(got.token_ids)
    for entry, token_id, (_, logprob, rank, top_ids, top_lps) in zip(
        got.logprobs, got.token_ids, want.logprobs, strict=True
    ):
        assert entry.token_id == token_id and entry.rank == rank == 1  # greedy: the top token
        assert math.isclose(entry.logprob, logprob, abs_tol=TOL)
        assert_same_top(
            [t.token_id for t in entry.top_logprobs],
            [t.logprob for t in entry.top_logprobs],
            top_ids,
            top_lps,
            TOL,
        )
        assert entry.text == tokenizer.decode([token_id], skip_special_tokens=False)
        assert all(t.text == tokenizer.decode([t.token_id]) for t in entry.top_logprobs)
    assert got.prompt_logprobs is not None
    assert [e.token_id for e in got.prompt_logprobs] == prompt_ids[1:]
    assert [len(e.top_logprobs) for e in got.prompt_logprobs] == [2] * (len(prompt_ids) - 1)
    assert [e.logprob for e in got.prompt_logprobs] == pytest.approx(
        [e[1] for e in want.prompt_logprobs], abs=TOL
    )
    assert plain.logprobs is None and plain.prompt_logprobs is None


def test_request_without_logprobs_carries_none(services) -> None:
    with grpc.insecure_channel(services.frontend.address) as channel:
        stub = frontend_grpc.FrontendServiceStub(channel)
        request = frontend_pb2.GenerateRequest(prompt=PROMPT)
        request.sampling_params.temperature = 0
        request.sampling_params.max_tokens = 6
        responses = list(stub.Generate(request, timeout=60))
    assert sum(len(r.token_ids) for r in responses) == 6
    assert all(not r.logprobs and not r.prompt_logprobs for r in responses)


@pytest.mark.parametrize(
    ("field", "value"), [("logprobs", 21), ("prompt_logprobs", 21), ("logprobs", -1)]
)
def test_out_of_range_k_is_invalid_argument(services, field, value) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        with pytest.raises(InvalidArgument) as e:
            client.generate(PROMPT, max_tokens=2, **{field: value})
    assert f"sampling_params.{field}" in str(e.value)


def test_chat_and_worker_generate_tokens_carry_logprobs(services) -> None:
    with Client(services.frontend.address, timeout=60) as client:
        reply = client.chat(
            [("user", "Hi!")], enable_thinking=False, temperature=0, max_tokens=5, logprobs=1
        )
    assert reply.logprobs is not None and len(reply.logprobs) == len(reply.token_ids)
    assert [e.token_id for e in reply.logprobs] == reply.token_ids
    assert all(e.text and len(e.top_logprobs) == 1 for e in reply.logprobs)
    # the worker's own streaming call: ids and numbers, no text (the worker has no tokenizer)
    with grpc.insecure_channel(services.worker.address) as channel:
        stub = worker_grpc.WorkerServiceStub(channel)
        request = worker_pb2.GenerateTokensRequest(request_id="lp", prompt_token_ids=[5, 6, 7, 8])
        request.sampling_params.max_tokens = 4
        request.sampling_params.temperature = 0
        request.sampling_params.logprobs = 2
        request.sampling_params.prompt_logprobs = 0
        responses = list(stub.GenerateTokens(request, timeout=60))
    ids = [t for r in responses for t in r.token_ids]
    entries = [e for r in responses for e in r.logprobs]
    prompt_entries = [e for r in responses for e in r.prompt_logprobs]
    assert [e.token_id for e in entries] == ids and len(ids) == 4
    assert all(len(e.top_logprobs) == 2 and e.rank == 1 and not e.text for e in entries)
    assert [e.token_id for e in prompt_entries] == [6, 7, 8]
    assert all(not e.top_logprobs and e.logprob <= 0 for e in prompt_entries)


MESSAGE_BOUND = 256  # --max-logprobs-per-message of the `bounded` pair


@pytest.fixture(scope="module")
def bounded(tiny_model_dir) -> Iterator[Pair]:
    """A pair whose frontend sends at most MESSAGE_BOUND logprob entries per message."""
    pair = start_pair(
        tiny_model_dir, frontend_args=("--max-logprobs-per-message", str(MESSAGE_BOUND))
    )
    yield pair
    pair.stop()


def test_long_prompt_logprobs_come_in_bounded_messages(bounded, offline_llm) -> None:
    """A 3,000-token prompt's entries arrive in messages of at most the bound (the worker splits
    its prefill chunks' too), the first token's ids with their own entries; joined, they equal the
    offline engine's."""
    with Client(bounded.frontend.address, timeout=300) as client:
        words = client.tokenize("The sea is wide and the sky is blue over the quiet town. " * 300)
        prompt_ids = words[:3000]
        chunks = list(
            client.generate_stream(
                prompt_ids,
                temperature=0,
                max_tokens=8,
                ignore_eos=True,
                logprobs=2,
                prompt_logprobs=5,
            )
        )
    for chunk in chunks:
        assert len(chunk.logprobs or ()) + len(chunk.prompt_logprobs or ()) <= MESSAGE_BOUND
        assert len(chunk.logprobs or ()) == len(chunk.token_ids)  # one entry per id
    prompt_chunks = [c for c in chunks if c.prompt_logprobs]
    assert len(prompt_chunks) >= math.ceil(2999 / MESSAGE_BOUND)
    assert all(not c.token_ids and not c.text for c in prompt_chunks[:-1])
    got = join_chunks(chunks)
    want = offline_llm.generate(
        [prompt_ids],
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=5),
        use_tqdm=False,
    )[0]
    assert got.token_ids == want.token_ids
    assert got.logprobs is not None and got.prompt_logprobs is not None
    assert [e.token_id for e in got.logprobs] == got.token_ids
    assert [e.logprob for e in got.logprobs] == pytest.approx(
        [e[1] for e in want.logprobs], abs=1e-4
    )
    assert [e.token_id for e in got.prompt_logprobs] == prompt_ids[1:]
    assert [e.logprob for e in got.prompt_logprobs] == pytest.approx(
        [e[1] for e in want.prompt_logprobs], abs=1e-4
    )
    for entry, (*_, top_ids, top_lps) in zip(
        got.prompt_logprobs, want.prompt_logprobs, strict=True
    ):
        assert_same_top(
            [t.token_id for t in entry.top_logprobs],
            [t.logprob for t in entry.top_logprobs],
            top_ids,
            top_lps,
            TOL,
        )
