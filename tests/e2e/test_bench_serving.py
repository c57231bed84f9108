"""`nanoserve bench serving` end to end on the tiny model with a handful of requests: the local
mode (offline in its own process, then worker and frontend started by the benchmark) and --address
mode against services this test session started. Checks the report's shape, not speed."""

import asyncio
import json
import subprocess
import sys

import grpc.aio
import pytest

from nanoserve.benchmarks import gpu_table, loadgen, serving
from nanoserve.benchmarks.workload import Request
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from tests.e2e.processes import REPO_ROOT, assert_idle

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SMALL = [
    "--num-prompts",
    "6",
    "--min-len",
    "8",
    "--max-len",
    "40",
    "--min-out",
    "3",
    "--max-out",
    "12",
    "--one-stream-prompt-len",
    "16",
    "--one-stream-tokens",
    "5",
    "--one-stream-runs",
    "1",
    "--ttft-buckets",
    "16,32",
]
PATH_KEYS = {
    "tok_s",
    "seconds",
    "output_tokens",
    "requests",
    "errors",
    "messages_per_token",
    "ttft_ms",
    "itl_ms",
    "tpot_ms",
    "ttft_ms_by_prompt_len",
    "loadgen",
    "service_cpu_cores",
    "one_stream_ms_per_token",
    "one_stream_ttft_ms",
    "one_stream_gap_ms",
}
PERCENTILE_KEYS = {"n", "p50", "p90", "p99", "max", "mean"}


def check_path(res: dict, requests: int, tokens: int) -> None:
    assert PATH_KEYS <= set(res), set(res)
    assert (res["requests"], res["errors"], res["output_tokens"]) == (requests, 0, tokens)
    assert res["tok_s"] > 0 and res["one_stream_ms_per_token"] > 0 and res["one_stream_ttft_ms"] > 0
    assert set(res["ttft_ms"]) == PERCENTILE_KEYS and res["ttft_ms"]["n"] == requests
    assert set(res["itl_ms"]) == PERCENTILE_KEYS and res["itl_ms"]["n"] > 0
    assert set(res["one_stream_gap_ms"]) == PERCENTILE_KEYS and res["one_stream_gap_ms"]["n"] > 0
    assert set(res["tpot_ms"]) == PERCENTILE_KEYS and 0 < res["tpot_ms"]["n"] <= requests
    assert sum(b["n"] for b in res["ttft_ms_by_prompt_len"].values()) == requests
    assert res["ttft_ms"]["p50"] <= res["ttft_ms"]["p99"] <= res["ttft_ms"]["max"]
    assert res["loadgen"]["cpu_s"] > 0


def test_bench_serving_offline_and_both_paths(tiny_model_dir, tmp_path, capsys):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanoserve.cli",
            "bench",
            "serving",
            "--json",
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--kvcache-block-size",
            "16",
            "--num-kvcache-blocks",
            "256",
            "--client-procs",
            "2",
            *SMALL,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])  # stdout: the JSON line alone
    tokens = sum(o for _, o in serving.workload.lengths(6, 8, 40, 3, 12))
    assert res["offline"]["output_tokens"] == tokens and res["offline"]["tok_s"] > 0
    for path in ("frontend", "worker"):
        check_path(res[path], 6, tokens)
        assert res[path]["loadgen"]["procs"] == 2
        assert res[f"{path}_over_offline"] > 0
        assert set(res[path]["service_cpu_cores"]) == {"worker", "frontend"}
        for run in res[path]["runs"]:  # the gRPC process alone: within its tree (+ the engine core)
            grpc_own, tree = run["worker_grpc_process"], run["services"]["worker"]
            assert 0 <= grpc_own["cpu_us_per_token"] <= tree["cpu_us_per_token"] + 1
    assert res["settings"]["kvcache_block_size"] == 16
    assert "ttft_frontend_minus_worker_ms" in res
    for path in ("frontend", "worker"):  # the warm-up was on: one-stream runs before the runs too
        before = res[path]["one_stream_before_runs"]
        assert before["one_stream_ms_per_token"] > 0 and before["one_stream_gap_ms"]["n"] > 0
        # each probe beside what the engine core's step loop did meanwhile (its CPU share, its
        # time waiting for a CPU): ~100% busy on CPU, where the step itself is the work
        for probes in (res[path]["one_stream_probes"], before["one_stream_probes"]):
            assert probes and all(p["ms_per_token"] > 0 for p in probes)
            loops = [p["step_loop"] for p in probes if p["step_loop"] is not None]
            assert loops and all(0 <= p["wait_pct"] <= 100 and p["cpus"] for p in loops)
            assert max(p["cpu_pct"] for p in loops) > 10, loops
    # scripts/gpu_run.sh's table reads the step logs
    log = proc.stderr + proc.stdout + "=== serving: exit 0 after 9 s\n"
    (tmp_path / "serving.log").write_text(log)
    gpu_table.main([str(tmp_path)])
    table = capsys.readouterr().out
    assert "serving: exit 0 after 9 s" in table
    assert "(worker gRPC process " in table and "one-stream before the runs: " in table
    assert "one-stream probes: " in table and " wait " in table
    assert f"frontend  {res['frontend']['tok_s']:>9,.0f} {res['frontend_over_offline']:>8}" in table
    assert json.loads((tmp_path / "results.json").read_text())[0]["bench"] == "serving"
    text = "\n".join(gpu_table.serving_lines({"step": "bench serving", **res}))  # without --json
    assert f"{res['worker_over_offline']:>8}" in text and "TTFT by prompt length" in text


def test_bench_serving_against_running_services(services):
    base = ["--address", services.frontend.address, "--client-procs", "1", *SMALL]
    res = serving.run(serving.build_parser().parse_args(base))
    tokens = sum(o for _, o in serving.workload.lengths(6, 8, 40, 3, 12))
    check_path(res["frontend"], 6, tokens)
    assert "offline" not in res and "worker" not in res
    assert res["tp"] == 1 and services.frontend.address in res["model"]
    poisson = [
        "--address",
        services.worker.address,
        "--target",
        "worker",
        "--client-procs",
        "2",
        "--client-channels",  # the requests dealt over 2 x 3 connections
        "3",
        "--request-rate",
        "50",
        "--warmup",
        "light",
        "--warmup-requests",
        "1",
        *SMALL,
    ]
    res = serving.run(serving.build_parser().parse_args(poisson))
    check_path(res["worker"], 6, tokens)
    assert res["request_rate"] == 50.0 and res["worker"]["loadgen"]["procs"] == 2
    assert_idle(services.worker.address)  # every stream ended and freed its blocks


def test_bench_serving_through_the_gateway_next_to_grpc(tiny_model_dir):
    """--target all: the OpenAI gateway's figures beside the frontend's and the worker's."""
    pytest.importorskip("fastapi", reason="the gateway extra: pip install '.[gateway]'")
    argv = [
        *("--model", str(tiny_model_dir), "--device", "cpu"),
        *("--kvcache-block-size", "16", "--num-kvcache-blocks", "256"),
        *("--target", "all", "--skip-offline", "--client-procs", "1", *SMALL),
    ]
    res = serving.run(serving.build_parser().parse_args(argv))
    tokens = sum(o for _, o in serving.workload.lengths(6, 8, 40, 3, 12))
    for path in ("frontend", "worker", "gateway"):
        check_path(res[path], 6, tokens)
    assert set(res["gateway"]["service_cpu_cores"]) == {"worker", "frontend", "gateway"}
    assert res["gateway_over_frontend"] > 0
    table = "\n".join(gpu_table.serving_lines({**res, "step": "serving_gateway"}))
    assert "  gateway " in table
    assert f"gateway (HTTP) / frontend (gRPC) tok/s: {res['gateway_over_frontend']}" in table


def test_bench_serving_both_openai_endpoints(tiny_model_dir):
    """--target openai: /v1/completions and /v1/chat/completions, every token of every request
    counted through each (chat's prompt is one user message of as many words as prompt ids)."""
    pytest.importorskip("fastapi", reason="the gateway extra: pip install '.[gateway]'")
    argv = [
        *("--model", str(tiny_model_dir), "--device", "cpu"),
        *("--kvcache-block-size", "16", "--num-kvcache-blocks", "256"),
        *("--target", "openai", "--skip-offline", "--client-procs", "1", *SMALL),
    ]
    res = serving.run(serving.build_parser().parse_args(argv))
    tokens = sum(o for _, o in serving.workload.lengths(6, 8, 40, 3, 12))
    for path in ("gateway", "chat"):
        check_path(res[path], 6, tokens)
        assert set(res[path]["service_cpu_cores"]) == {"worker", "frontend", "gateway"}
    assert "frontend" not in res and "worker" not in res
    assert "  chat " in "\n".join(gpu_table.serving_lines({**res, "step": "serving_openai"}))


def frontend_cost(*argv: str) -> dict:
    """`nanoserve bench frontend-cost --json ARGV` in its own process: its JSON line."""
    out = subprocess.run(
        [sys.executable, "-m", "nanoserve.cli", "bench", "frontend-cost", "--json", *argv],
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_frontend_cost_streams_every_token_through_a_stand_in_worker() -> None:
    """`nanoserve bench frontend-cost`: a real frontend against the stand-in worker; every id of
    every request arrives, and the frontend's CPU per token is reported (a figure, not a bound)."""
    res = frontend_cost(
        "--num-prompts", "6", "--max-tokens", "9", "--prompt-len", "5", "--step-ms", "1",
        "--client-procs", "1",
    )  # fmt: skip
    assert (res["requests"], res["output_tokens"], res["errors"]) == (6, 54, 0)
    # a figure, not a bound: 54 tokens may take less than one clock tick of CPU (then 0)
    assert res["frontend_us_per_token"] >= 0 and res["tok_s"] > 0


def test_frontend_cost_spreads_streams_over_client_channels_and_frontend_processes() -> None:
    """Several frontend processes on one port, each client process with several channels: every
    token arrives, and the report lists each frontend process's cores and the stand-in's ceiling."""
    res = frontend_cost(
        "--num-prompts", "16", "--max-tokens", "20", "--prompt-len", "5", "--step-ms", "5",
        "--client-procs", "2", "--client-channels", "2", "--frontend-processes", "2",
    )  # fmt: skip
    assert (res["requests"], res["output_tokens"], res["errors"]) == (16, 320, 0)
    assert res["frontend_processes"] == 2 and len(res["frontend_cores_each"]) == 2
    assert all(c >= 0 for c in res["frontend_cores_each"])
    assert res["client_connections"] == 4
    assert res["ceiling_tok_s"] == 16 / 0.005 and 0 < res["fraction_of_ceiling"]
    # the gaps between a stream's messages (at most 19 a stream of 20), which one stand-in step
    # (5 ms) bounds from below unless two messages of a step went apart
    assert 0 < res["itl_ms"]["n"] <= 16 * 19 and res["itl_ms"]["p50"] > 0
    assert res["itl_p99_over_p50"] >= 1


@pytest.mark.parametrize("target", ["gateway", "chat"])
def test_frontend_cost_through_either_openai_endpoint(target: str) -> None:
    """--target gateway / chat: every token of every request arrives as an SSE event of
    /v1/completions or /v1/chat/completions, and the gateway's CPU per token is reported."""
    pytest.importorskip("fastapi", reason="the gateway extra: pip install '.[gateway]'")
    res = frontend_cost(
        "--num-prompts", "6", "--max-tokens", "9", "--prompt-len", "5", "--step-ms", "2",
        "--client-procs", "1", "--target", target,
    )  # fmt: skip
    assert (res["requests"], res["output_tokens"], res["errors"]) == (6, 54, 0)
    assert res["gateway_us_per_token"] >= 0 and len(res["gateway_cores_each"]) == 1
    assert "client_connections" not in res


@pytest.mark.parametrize("target", ["frontend", "worker"])
def test_worker_cost_runs_the_real_worker_on_a_stand_in_runner(target: str) -> None:
    """`nanoserve bench worker-cost`: the real worker's gRPC process and engine core (scheduler,
    block manager, the pipe) with a stand-in model runner; every id of every request arrives
    through the frontend's Session and straight through GenerateTokens, and the two processes'
    CPU per token is reported apart (figures, not bounds)."""
    out = subprocess.run(
        [sys.executable, "-m", "nanoserve.cli", "bench", "worker-cost", "--json",
         "--num-prompts", "12", "--max-tokens", "15", "--prompt-len", "5", "--step-ms", "2",
         "--client-procs", "1", "--target", target],
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert (res["target"], res["output_tokens"], res["errors"]) == (target, 180, 0)
    assert res["worker_grpc_us_per_token"] >= 0 and res["engine_core_us_per_token"] >= 0
    assert ("frontend_us_per_token" in res) is (target == "frontend")
    assert res["ceiling_tok_s"] == 12 / 0.002 and res["tok_s"] > 0


class _PeerRecorder(frontend_grpc.FrontendServiceServicer):
    """A frontend that answers every Generate with all its tokens at once and notes the peer (the
    client's address and port: one per TCP connection)."""

    def __init__(self) -> None:
        self.peers: set[str] = set()

    async def Generate(self, request, context):
        self.peers.add(context.peer())
        yield frontend_pb2.GenerateResponse(token_ids=[7] * request.sampling_params.max_tokens)


@pytest.mark.parametrize("channels", [1, 3])
def test_loadgen_channels_are_separate_connections(channels: int) -> None:
    """grpc shares one connection among a process's channels with identical args to an address;
    the load generator's `channels` must each be their own, seen as distinct peers by the server."""

    async def go() -> tuple[dict, set[str]]:
        recorder = _PeerRecorder()
        server = grpc.aio.server()
        frontend_grpc.add_FrontendServiceServicer_to_server(recorder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            requests = [Request(f"r{i}", [1, 2, 3], 2, 0.0) for i in range(6)]
            res = await loadgen.run(
                "frontend", f"127.0.0.1:{port}", requests, 0.0, channels=channels
            )
        finally:
            await server.stop(0)
        return res, recorder.peers

    res, peers = asyncio.run(go())
    assert [r["tokens"] for r in res["results"]] == [2] * 6
    assert len(peers) == channels, peers
