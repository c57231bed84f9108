"""Request records, their log lines, and the Prometheus metrics both services expose, read back
with prometheus_client's own text parser."""

import asyncio
import json
import logging

import grpc
import grpc.aio
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.frontend.metrics import FrontendMetrics
from nanoserve.frontend.request_log import RequestLog, RequestRecord, current_record, recorded
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.worker.core.frames import Finish
from nanoserve.worker.core.stats_log import Load
from nanoserve.worker.service.metrics import EngineHistograms, WorkerLoad, worker_registry


def samples(registry) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, through the text format and its parser."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def response(ids: list[int], finish: int = 0, prompt: int = 0, completion: int = 0):
    r = frontend_pb2.GenerateResponse(token_ids=ids, finish_reason=finish)
    if finish:
        r.usage.prompt_tokens, r.usage.completion_tokens = prompt, completion
    return r


def finished_record(tokens: int = 4, reason: int = common_pb2.FINISH_REASON_LENGTH):
    record = RequestRecord("r1", "Generate", "ipv4:127.0.0.1:5555", start=0.0)
    for i in range(tokens - 1):
        record.add(response([i]))
    record.add(response([9], reason, prompt=7, completion=tokens))
    record.first_token_at, record.last_token_at, record.end = 0.5, 0.8, 1.0
    record.sent_at = 0.002
    record.code = "OK"
    return record


M = ("model_name", "tiny")


def test_frontend_metrics_move_by_what_the_requests_imply() -> None:
    metrics = FrontendMetrics("tiny")
    metrics.track_in_flight(lambda: 3)
    for _ in range(2):
        metrics.observe(finished_record(tokens=4))
    metrics.observe(finished_record(tokens=1, reason=common_pb2.FINISH_REASON_STOP))
    refused = RequestRecord("r2", "Chat", "peer", start=0.0, code="RESOURCE_EXHAUSTED", end=0.01)
    metrics.observe(refused)
    cancelled = RequestRecord("r3", "Generate", "peer", start=0.0, end=2.0)
    cancelled.add(response([1, 2]))
    metrics.observe(cancelled)
    got = samples(metrics.registry)
    assert got[("vllm:request_success_total", (("finished_reason", "length"), M))] == 2
    assert got[("vllm:request_success_total", (("finished_reason", "stop"), M))] == 1
    assert got[("nanoserve:request_errors_total", (("code", "RESOURCE_EXHAUSTED"), M))] == 1
    assert got[("nanoserve:request_errors_total", (("code", "CANCELLED"), M))] == 1
    assert got[("nanoserve:admission_refusals_total", (M,))] == 1
    assert got[("vllm:prompt_tokens_total", (M,))] == 3 * 7
    assert got[("vllm:generation_tokens_total", (M,))] == 4 + 4 + 1 + 2  # streamed, cancelled too
    assert got[("vllm:e2e_request_latency_seconds_count", (M,))] == 3
    assert got[("vllm:e2e_request_latency_seconds_sum", (M,))] == pytest.approx(3.0)
    assert got[("vllm:time_to_first_token_seconds_count", (M,))] == 4  # the refusal had no token
    assert got[("vllm:inter_token_latency_seconds_count", (M,))] == 3  # >= 2 tokens
    assert got[("vllm:inter_token_latency_seconds_sum", (M,))] == pytest.approx(2 * 0.1, abs=0.05)
    assert got[("nanoserve:frontend_requests_in_flight", (M,))] == 3
    # the frontend's own latency: once per request sent to the worker (not the refusal)
    assert got[("nanoserve:frontend_latency_seconds_count", (M,))] == 3
    assert got[("nanoserve:frontend_latency_seconds_sum", (M,))] == pytest.approx(3 * 0.002)


def test_engine_histograms_per_step_and_per_finished_request() -> None:
    registry = worker_registry("tiny", lambda: None)
    histograms = EngineHistograms("tiny", registry)
    histograms.observe_step(num_seqs=3, num_tokens=40, step_s=0.02)  # a prefill of 37 + 3 decodes
    histograms.observe_step(num_seqs=4, num_tokens=4, step_s=0.004)
    histograms.observe_finish(Finish("length", 7, 5, 0, None, 0.1, 0.2, 0.5))
    got = samples(registry)
    assert got[("vllm:iteration_tokens_total_count", (M,))] == 2
    assert got[("vllm:iteration_tokens_total_sum", (M,))] == 44
    assert got[("vllm:iteration_tokens_total_bucket", (("le", "32.0"), M))] == 1
    assert got[("nanoserve:batch_size_sum", (M,))] == 7
    assert got[("nanoserve:engine_step_duration_seconds_sum", (M,))] == pytest.approx(0.024)
    assert got[("nanoserve:engine_step_duration_seconds_bucket", (("le", "0.005"), M))] == 1
    for phase, seconds in (("queue", 0.1), ("prefill", 0.2), ("decode", 0.5)):
        assert got[(f"vllm:request_{phase}_time_seconds_count", (M,))] == 1
        assert got[(f"vllm:request_{phase}_time_seconds_sum", (M,))] == pytest.approx(seconds)


def test_worker_metrics_read_the_engine_at_scrape_time() -> None:
    load = None
    registry = worker_registry("tiny", lambda: load)
    assert samples(registry) == {("nanoserve:worker_ready", (M,)): 0.0}
    load = WorkerLoad(
        num_running=2,
        num_waiting=1,
        num_free_blocks=384,
        num_total_blocks=512,
        prefix_cache_queries=100,
        prefix_cache_hits=32,
        num_preemptions=5,
        prompt_tokens=68,
        generation_tokens=40,
        num_finished=3,
    )
    got = samples(registry)
    assert got[("nanoserve:worker_ready", (M,))] == 1
    assert got[("vllm:num_requests_running", (M,))] == 2
    assert got[("vllm:num_requests_waiting", (M,))] == 1
    assert got[("vllm:kv_cache_usage_perc", (M,))] == pytest.approx(0.25)
    assert got[("vllm:prefix_cache_queries_total", (M,))] == 100
    assert got[("vllm:prefix_cache_hits_total", (M,))] == 32
    assert got[("vllm:num_preemptions_total", (M,))] == 5
    assert got[("vllm:prompt_tokens_total", (M,))] == 68
    assert got[("vllm:generation_tokens_total", (M,))] == 40


def test_worker_load_from_an_engine(tiny_model_dir) -> None:
    from nanoserve.worker import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    try:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5), use_tqdm=False)
        load = WorkerLoad.from_load(Load.of(llm), 1)  # LLM is an LLMEngine
    finally:
        llm.shutdown()
    assert (load.num_running, load.num_waiting) == (0, 0)
    assert load.num_free_blocks == load.num_total_blocks == 64
    assert load.generation_tokens == 5 and load.prompt_tokens == 3


def test_request_log_text_and_json(caplog) -> None:
    record = finished_record()
    text = RequestLog("text").format(record)
    assert text.startswith("request 'r1' Generate OK finish=length prompt=7 completion=4")
    assert "ttft=0.500s duration=1.000s peer=ipv4:127.0.0.1:5555" in text
    fields = json.loads(RequestLog("json").format(record))
    assert fields["event"] == "request_end" and fields["request_id"] == "r1"
    assert (fields["code"], fields["finish_reason"]) == ("OK", "length")
    assert (fields["prompt_tokens"], fields["completion_tokens"]) == (7, 4)
    assert (fields["ttft_s"], fields["duration_s"], fields["peer"]) == (0.5, 1.0, record.peer)
    with pytest.raises(ValueError):
        RequestLog("xml")
    caplog.set_level(logging.INFO, logger="nanoserve.requests")
    RequestLog("text")(record)
    assert [r.getMessage() for r in caplog.records] == [text]


class FakeContext:
    def __init__(self) -> None:
        self.trailing = None
        self._code = None

    def peer(self) -> str:
        return "ipv4:10.0.0.1:4242"

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = metadata

    def code(self):
        return self._code

    def time_remaining(self):
        return None

    async def abort(self, code, details):
        self._code = code
        raise grpc.aio.AbortError()


class Servicer:
    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.ended: list[RequestRecord] = []
        self.request_sinks = [self.ended.append]

    @recorded
    async def Generate(self, request, context):
        async for r in self.behaviour(request, context):
            yield r


async def _drain(servicer, request, context) -> None:
    async for _ in servicer.Generate(request, context):
        pass


def sent(r: frontend_pb2.GenerateResponse) -> frontend_pb2.GenerateResponse:
    """As RequestRunner does for each message: its ids counted in the call's record."""
    record = current_record()
    assert record is not None  # inside `recorded`
    record.add_tokens(len(r.token_ids))
    return r


def test_recorded_sees_every_end() -> None:
    async def finishes(request, context):
        yield sent(response([1, 2]))
        yield sent(response([3], common_pb2.FINISH_REASON_STOP, prompt=5, completion=3))

    async def refused(request, context):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        yield  # pragma: no cover

    async def hangs(request, context):
        yield sent(response([1]))
        await asyncio.sleep(60)
        yield response([2])  # pragma: no cover

    async def main() -> list[RequestRecord]:
        ended = []
        ok = Servicer(finishes)
        context = FakeContext()
        request = frontend_pb2.GenerateRequest(prompt="hi")  # no id: one is made and sent back
        await _drain(ok, request, context)
        assert request.request_id and context.trailing == (("x-request-id", request.request_id),)
        ended += ok.ended
        full = Servicer(refused)
        with pytest.raises(grpc.aio.AbortError):
            await _drain(full, frontend_pb2.GenerateRequest(request_id="mine"), FakeContext())
        ended += full.ended
        slow = Servicer(hangs)
        task = asyncio.ensure_future(_drain(slow, frontend_pb2.GenerateRequest(), FakeContext()))
        await asyncio.sleep(0.05)
        task.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        return ended + slow.ended

    ok, full, gone = asyncio.run(main())
    assert (ok.code, ok.finish_reason) == ("OK", "stop")
    assert (ok.completion_tokens, ok.prompt_tokens) == (3, 5)
    assert ok.ttft is not None and ok.end is not None and ok.peer == "ipv4:10.0.0.1:4242"
    assert (full.request_id, full.code, full.completion_tokens) == ("mine", "RESOURCE_EXHAUSTED", 0)
    assert (gone.code, gone.completion_tokens) == ("CANCELLED", 1)


def test_tool_calls_finish_is_named() -> None:
    metrics = FrontendMetrics("tiny")
    record = finished_record(tokens=2, reason=common_pb2.FINISH_REASON_TOOL_CALLS)
    assert record.finish_reason == "tool_calls"
    metrics.observe(record)
    got = samples(metrics.registry)
    assert got[("vllm:request_success_total", (("finished_reason", "tool_calls"), M))] == 1
