"""What an operator sees, against a pair started with --metrics-port on both services and
--log-format json: both /metrics endpoints parse with prometheus_client's parser and move by what
the workload implies; every ended request leaves one log line with its id and terminal status.
"""

import asyncio
import collections
import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.client import Client
from nanoserve.errors import DeadlineExceeded, InvalidArgument
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from tests.e2e.processes import Pair, start_pair, wait_idle

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def observed(tiny_model_dir) -> Iterator[tuple[Pair, int, int]]:
    frontend_metrics, worker_metrics = free_port(), free_port()
    pair = start_pair(
        tiny_model_dir,
        worker_args=("--metrics-port", str(worker_metrics)),
        frontend_args=("--metrics-port", str(frontend_metrics), "--log-format", "json"),
    )
    yield pair, frontend_metrics, worker_metrics
    pair.stop()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_by_what_the_workload_implies(observed) -> None:
    pair, frontend_port, worker_port = observed
    before_f, before_w = scrape(frontend_port), scrape(worker_port)
    completions = []
    with Client(pair.frontend.address, timeout=60) as client:
        for i in range(4):  # distinct prompts: no prefix-cache hits to reason about
            completions.append(client.generate(f"prompt number {i} says", max_tokens=5 + i))
        # one in flight while scraping
        stream = client.generate_stream("a long story about", max_tokens=3000)
        next(stream)
        during_w, during_f = scrape(worker_port), scrape(frontend_port)
        stream.close()
    assert value(during_w, "vllm:num_requests_running") == 1
    assert value(during_w, "vllm:kv_cache_usage_perc") > 0
    assert value(during_f, "nanoserve:frontend_requests_in_flight") == 1

    load = wait_idle(pair.worker.address)
    assert load.num_running == 0
    after_f, after_w = scrape(frontend_port), scrape(worker_port)
    streamed = sum(len(c.token_ids) for c in completions)
    assert streamed == 5 + 6 + 7 + 8

    def delta(after: dict, before: dict, name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(after_f, before_f, "vllm:request_success_total", finished_reason="length") == 4
    assert delta(after_f, before_f, "vllm:e2e_request_latency_seconds_count") == 4
    assert delta(after_f, before_f, "vllm:time_to_first_token_seconds_count") == 5
    assert delta(after_f, before_f, "vllm:prompt_tokens_total") == sum(
        c.usage.prompt_tokens for c in completions
    )
    # the cancelled stream's streamed tokens count too: at least the one it read
    generated = delta(after_f, before_f, "vllm:generation_tokens_total")
    assert generated >= streamed + 1
    assert delta(after_f, before_f, "nanoserve:request_errors_total", code="CANCELLED") == 1
    assert delta(after_w, before_w, "vllm:generation_tokens_total") >= generated
    assert delta(after_w, before_w, "nanoserve:worker_requests_finished_total") == 4
    assert value(after_w, "vllm:kv_cache_usage_perc") == 0  # every block back after quiesce
    assert value(after_w, "vllm:num_requests_running") == 0
    assert value(after_w, "vllm:num_requests_waiting") == 0
    assert value(after_w, "nanoserve:worker_ready") == 1
    assert value(after_f, "nanoserve:frontend_requests_in_flight") == 0
    # the frontend's own latency: once per request it sent to the worker (all five)
    assert delta(after_f, before_f, "nanoserve:frontend_latency_seconds_count") == 5

    # the engine's histograms: one sample per finished request for each phase ...
    for phase in ("queue", "prefill", "decode"):
        assert delta(after_w, before_w, f"vllm:request_{phase}_time_seconds_count") == 4, phase
    # ... and one per engine step: every token computed lands in some step, and every sequence
    # that sampled a token in a step counts once in that step's batch size
    steps = delta(after_w, before_w, "nanoserve:engine_step_duration_seconds_count")
    assert steps >= 8  # the longest request alone sampled 8 tokens, one per step
    assert delta(after_w, before_w, "vllm:iteration_tokens_total_count") == steps
    assert delta(after_w, before_w, "nanoserve:batch_size_count") == steps
    worker_generated = delta(after_w, before_w, "vllm:generation_tokens_total")
    assert delta(after_w, before_w, "vllm:iteration_tokens_total_sum") == worker_generated + delta(
        after_w, before_w, "vllm:prompt_tokens_total"
    )
    assert delta(after_w, before_w, "nanoserve:batch_size_sum") == worker_generated
    assert delta(after_w, before_w, "nanoserve:engine_step_duration_seconds_sum") > 0


def request_lines(pair: Pair) -> dict[str, list[dict]]:
    """The frontend's request_end JSON objects, by request id."""
    found: dict[str, list[dict]] = {}
    for line in pair.frontend.lines:
        start = line.find('{"')
        if start < 0 or '"request_end"' not in line:
            continue
        fields = json.loads(line[start:])
        found.setdefault(fields["request_id"], []).append(fields)
    return found


def test_one_log_line_per_terminal_state(observed) -> None:
    pair = observed[0]
    with Client(pair.frontend.address, timeout=60) as client:
        client.generate("finishes", request_id="ops-ok", max_tokens=3)
        stopped = client.generate("stops", request_id="ops-stop", max_tokens=50, stop=[" ", "e"])
        with pytest.raises(InvalidArgument):
            client.generate("bad", request_id="ops-invalid", temperature=-1.0)
        with pytest.raises(DeadlineExceeded):
            client.generate("times out", request_id="ops-deadline", max_tokens=3000, timeout=0.5)
        stream = client.generate_stream("cancelled", request_id="ops-cancel", max_tokens=3000)
        next(stream)
        stream.close()
    # without a request id: the server makes one, logs it and sends it back in trailing metadata
    with grpc.insecure_channel(pair.frontend.address) as channel:
        responses = frontend_grpc.FrontendServiceStub(channel).Generate(
            frontend_pb2.GenerateRequest(
                prompt="no id", sampling_params=common_pb2.SamplingParams(max_tokens=3)
            ),
            timeout=30,
        )
        for _ in responses:
            pass
        sent_back = dict(responses.trailing_metadata())["x-request-id"]
    deadline = time.monotonic() + 10
    wanted = {
        "ops-ok": "OK",
        "ops-stop": "OK",
        "ops-invalid": "INVALID_ARGUMENT",
        "ops-deadline": "DEADLINE_EXCEEDED",
        "ops-cancel": "CANCELLED",
        sent_back: "OK",
    }
    while time.monotonic() < deadline:
        lines = request_lines(pair)
        if all(request_id in lines for request_id in wanted):
            break
        time.sleep(0.1)
    for request_id, code in wanted.items():
        assert len(lines.get(request_id, [])) == 1, (request_id, pair.frontend.output(60))
        line = lines[request_id][0]
        assert line["code"] == code, line
        assert line["peer"].startswith("ipv4:127.0.0.1:") and line["duration_s"] >= 0
    assert lines["ops-ok"][0]["finish_reason"] == "length"
    assert lines["ops-ok"][0]["completion_tokens"] == 3 and lines["ops-ok"][0]["ttft_s"] > 0
    assert lines["ops-stop"][0]["finish_reason"] == stopped.finish_reason
    assert lines["ops-invalid"][0]["completion_tokens"] == 0
    assert lines["ops-invalid"][0]["ttft_s"] is None
    # the worker logs the requests it aborted under the id it was sent, the frontend's `id#n`
    aborted = {"ops-cancel": ("CANCELLED",), "ops-deadline": ("DEADLINE_EXCEEDED", "CANCELLED")}
    while time.monotonic() < deadline and not all(worker_lines(pair, r) for r in aborted):
        time.sleep(0.1)
    for request_id, codes in aborted.items():
        found = worker_lines(pair, request_id)
        assert len(found) == 1, (request_id, pair.worker.output(60))
        assert found[0].split("' ", 1)[1].split(":")[0] in codes, found
    assert worker_lines(pair, "ops-ok") == []  # a request that finished leaves no worker line


def worker_lines(pair: Pair, request_id: str) -> list[str]:
    """The worker's `request 'ID#n' CODE: why` lines for the frontend's request id ID."""
    return [line for line in pair.worker.lines if f"request '{request_id}#" in line]


def test_a_burst_of_calls_on_one_channel_ends_ok_or_refused(observed) -> None:
    """1,800 Generate calls opened at once on one grpc.aio channel (issue 15): each ends OK or
    RESOURCE_EXHAUSTED from admission (max_concurrent_requests 1024), none CANCELLED by gRPC
    core's drop of calls waiting past 1,000 for the server loop, and each leaves its log line."""
    pair = observed[0]

    async def burst() -> collections.Counter:
        codes: collections.Counter = collections.Counter()
        async with grpc.aio.insecure_channel(pair.frontend.address) as channel:
            stub = frontend_grpc.FrontendServiceStub(channel)

            async def one(i: int) -> None:
                request = frontend_pb2.GenerateRequest(
                    prompt=f"burst {i}",
                    request_id=f"burst-{i}",
                    sampling_params=common_pb2.SamplingParams(max_tokens=1 + i % 2),
                )
                try:
                    async for _ in stub.Generate(request, timeout=120):
                        pass
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    codes[e.code().name] += 1

            await asyncio.gather(*(one(i) for i in range(1800)))
        return codes

    codes = asyncio.run(burst())
    assert sum(codes.values()) == 1800
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["OK"] >= 1024, codes  # the first 1024 are admitted, later ones as slots free
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = request_lines(pair)
        if all(f"burst-{i}" in lines for i in range(1800)):
            break
        time.sleep(0.2)
    logged = collections.Counter(lines[f"burst-{i}"][0]["code"] for i in range(1800))
    assert logged == codes
