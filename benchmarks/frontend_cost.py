"""`nanoserve bench frontend-cost`: the frontend's CPU per streamed token, measured without a GPU.

A stand-in worker (WorkerService with no model: every `--step-ms` it gives each live request one
random id, as a decode step would) feeds a real frontend process; the load generator streams
Generate calls through it. The figure is the frontend process tree's CPU seconds per output token:
at the H200's ~22k tok/s one frontend core allows at most ~45 µs, so this is where the served
path's ceiling is read on a CPU machine.
"""

import argparse
import asyncio
import json
import random
import sys
import time

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve.benchmarks.loadgen import HTTP_TARGETS, run_processes
from nanoserve.benchmarks.services import Service, start_replicas, tree_cpu_s
from nanoserve.benchmarks.stats import summarize
from nanoserve.benchmarks.workload import Request, arrivals
from nanoserve.grpc_options import server_options
from nanoserve.model_files import resolve_model_dir, tokenizer_digest
from nanoserve.process import WORKER_SERVICE
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc


class StandInWorker(worker_grpc.WorkerServiceServicer):
    """Answers GetModelInfo, GetLoad and Session as a worker would, at `step_s` per decode step:
    a fixed cadence, so its ceiling is (live requests) / step_s tokens a second whatever building
    a step costs it."""

    def __init__(self, model_dir: str, step_s: float) -> None:
        self.step_s = step_s
        self.info = worker_pb2.WorkerServiceGetModelInfoResponse(
            model_name="stand-in",
            max_model_len=4096,
            vocab_size=151936,
            eos_token_ids=[151645],
            kvcache_block_size=256,
            num_kvcache_blocks=4096,
            tensor_parallel_size=1,
            tokenizer_digest=tokenizer_digest(model_dir),
            max_num_seqs=512,
            max_num_batched_tokens=16384,
            dtype="bfloat16",
            device="stand-in",
        )

    async def GetModelInfo(self, request, context):
        return self.info

    async def GetLoad(self, request, context):
        return worker_pb2.GetLoadResponse(num_free_blocks=4096, num_total_blocks=4096)

    async def Session(self, request_iterator, context):
        live: dict[str, list[int]] = {}  # request id -> [tokens left, tokens given, prompt len]

        async def read() -> None:
            async for message in request_iterator:
                for add in message.adds:
                    r = add.request
                    live[r.request_id] = [r.sampling_params.max_tokens, 0, len(r.prompt_token_ids)]
                for request_id in message.aborts:
                    live.pop(request_id, None)

        reader = asyncio.create_task(read())
        rng = random.Random(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        try:
            while not reader.done():
                # Sleep until the next deadline, not for a whole step after building this one (the
                # period would be step_s + the build). A late step goes at once, but a stall leaves
                # at most one step of debt: no burst of missed steps after it.
                deadline = max(deadline + self.step_s, loop.time() - self.step_s)
                await asyncio.sleep(deadline - loop.time())
                if not live:
                    continue
                response = worker_pb2.SessionResponse()
                for request_id, state in list(live.items()):
                    out = response.outputs.add(
                        request_id=request_id, token_ids=[rng.randrange(1000, 30000)]
                    )
                    state[0] -= 1
                    state[1] += 1
                    if state[0] <= 0:
                        out.finish_reason = common_pb2.FINISH_REASON_LENGTH
                        out.usage.prompt_tokens = state[2]
                        out.usage.completion_tokens = state[1]
                        del live[request_id]
                yield response
        finally:
            reader.cancel()


async def serve_stand_in(model: str, step_ms: float) -> None:
    server = grpc.aio.server(options=server_options())  # the keepalive the frontend expects
    worker_grpc.add_WorkerServiceServicer_to_server(
        StandInWorker(resolve_model_dir(model), step_ms / 1000), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", WORKER_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"worker listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench frontend-cost", description=__doc__)
    p.add_argument("--model", default="tiny", help="the frontend's tokenizer (default: tiny)")
    p.add_argument("--step-ms", type=float, default=5.0, help="the stand-in's decode step")
    p.add_argument("--num-prompts", type=int, default=256, help="concurrent requests")
    p.add_argument("--max-tokens", type=int, default=200, help="output tokens of each request")
    p.add_argument("--prompt-len", type=int, default=100, help="prompt tokens of each request")
    p.add_argument("--client-procs", type=int, default=2, help="load generator processes")
    p.add_argument(
        "--client-channels",
        type=int,
        default=4,
        help="gRPC channels (TCP connections) of each load generator process, requests dealt "
        "round-robin over them (default: 4). Frontends sharing a port get whole connections, as "
        "the kernel hashes them, and a real fleet's streams come over many: a few connections "
        "would load them unevenly. No effect with --target gateway or chat (a connection per request)",
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrivals of this many requests/s (default: all at once)",
    )
    p.add_argument(
        "--target",
        choices=["frontend", *HTTP_TARGETS],
        default="frontend",
        help="where the load goes: the frontend, or the OpenAI gateway in front of it, its "
        "/v1/completions (gateway) or /v1/chat/completions (chat); the gateway's CPU per token "
        "is then reported too",
    )
    p.add_argument(
        "--frontend-processes",
        type=int,
        default=1,
        help="frontend processes sharing one port, and as many gateways (nanoserve serve's flag)",
    )
    p.add_argument("--frontend-args", default="", help="more flags for the frontend")
    p.add_argument(
        "--gateway-args", default="", help='more flags for the gateway, e.g. "--stream-interval 4"'
    )
    p.add_argument(
        "--frontend-python",
        default=sys.executable,
        help="the frontend's interpreter (another checkout's venv: compare two frontends)",
    )
    p.add_argument(
        "--traces",
        action="store_true",
        help="the frontends (and gateways) export OpenTelemetry traces of every request to an "
        "OTLP receiver in this process: the tracing cost per token (spans_received says so)",
    )
    p.add_argument(
        "--no-detokenize",
        action="store_true",
        help="ask for token ids only (SamplingParams.detokenize false; gRPC targets): the "
        "frontend's cost without its per-token decoding",
    )
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.add_argument(
        "--stand-in-worker",
        action="store_true",
        help="serve as the stand-in worker and print its address (the benchmark starts one)",
    )
    return p


def measure(args: argparse.Namespace) -> dict:
    py = [sys.executable, "-m"]
    sink = counter = None
    traced: list[str] = []
    if args.traces:
        from nanoserve.benchmarks.otlp_sink import start_sink

        sink, counter, sink_address = start_sink()
        traced = ["--otlp-traces-endpoint", sink_address]
    worker = Service(
        "worker",
        [*py, "nanoserve.benchmarks.frontend_cost", "--stand-in-worker", "--model", args.model,
         "--step-ms", str(args.step_ms)],
    )  # fmt: skip
    services = [worker]
    try:
        address = worker.wait_serving(60)
        byname: dict[str, Service] = {}
        address = start_replicas(
            byname,
            "frontend",
            [args.frontend_python, "-m", "nanoserve.frontend", "--model", args.model,
             "--worker-address", address, *traced, *args.frontend_args.split()],
            args.frontend_processes,
            120,
        )  # fmt: skip
        if args.target in HTTP_TARGETS:
            address = start_replicas(
                byname,
                "gateway",
                [*py, "nanoserve.frontend.gateway", "--frontend-address", address, *traced,
                 *args.gateway_args.split()],
                args.frontend_processes,
                60,
            )  # fmt: skip
        services += byname.values()
        rng = random.Random(0)

        def requests(tag: str, n: int, max_tokens: int, rate: float) -> list[Request]:
            return [
                Request(
                    f"{tag}-{i}",
                    [rng.randrange(1000, 30000) for _ in range(args.prompt_len)],
                    max_tokens,
                    at,
                )
                for i, at in enumerate(arrivals(n, rate))
            ]

        run_processes(
            args.target,
            address,
            requests("warm", 32, 8, float("inf")),
            0.0,
            1,
            channels=args.client_channels,
            detokenize=not args.no_detokenize,
        )
        cpu = {s.name: tree_cpu_s(s.process.pid) for s in services}
        t = time.perf_counter()
        res = run_processes(
            args.target,
            address,
            requests("run", args.num_prompts, args.max_tokens, args.request_rate),
            0.0,
            args.client_procs,
            channels=args.client_channels,
            detokenize=not args.no_detokenize,
        )
        # the clients' own clock, from when all are connected: not their processes' spawn, imports
        # and results' return (a second or more, against a run of a few seconds). The services'
        # CPU is counted over both, but they idle outside the run.
        wall = res["wall_s"]
        client_overhead_s = time.perf_counter() - t - wall
        used = {s.name: tree_cpu_s(s.process.pid) - cpu[s.name] for s in services}
    finally:
        for s in reversed(services):
            s.stop()  # a traced service exports what it holds before it exits
        if sink is not None:
            sink.stop(0)
    tokens = sum(r["tokens"] for r in res["results"])
    errors = sum(1 for r in res["results"] if r.get("error"))
    ceiling = args.num_prompts / (args.step_ms / 1000)  # every request a token every step
    # the stand-in's steps keep a fixed cadence: any spread of the gaps between a stream's messages
    # beyond one step is the services' and the clients' own (their queues, their bursts)
    itl = summarize((g for r in res["results"] for g in r.get("gaps", ())), 1e3)
    return dict(
        bench="frontend_cost",
        requests=args.num_prompts,
        output_tokens=tokens,
        errors=errors,
        tok_s=round(tokens / wall, 1),
        seconds=round(wall, 3),
        client_overhead_s=round(client_overhead_s, 3),
        ceiling_tok_s=round(ceiling, 1),
        fraction_of_ceiling=round(tokens / wall / ceiling, 3),
        messages_per_token=round(sum(r["messages"] for r in res["results"]) / max(tokens, 1), 3),
        itl_ms=itl,
        itl_p99_over_p50=round(itl["p99"] / itl["p50"], 2) if itl["n"] else None,
        frontend_us_per_token=round(_sum(used, "frontend") / max(tokens, 1) * 1e6, 2),
        frontend_cores=round(_sum(used, "frontend") / wall, 2),
        frontend_cores_each=_each(used, "frontend", wall),
        frontend_processes=args.frontend_processes,
        detokenize=not args.no_detokenize,
        **(
            {"client_connections": args.client_procs * args.client_channels}
            if args.target == "frontend"
            else {}
        ),
        stand_in_us_per_token=round(used["worker"] / max(tokens, 1) * 1e6, 2),
        stand_in_cores=round(used["worker"] / wall, 2),
        **(
            {
                "gateway_us_per_token": round(_sum(used, "gateway") / max(tokens, 1) * 1e6, 2),
                "gateway_cores": round(_sum(used, "gateway") / wall, 2),
                "gateway_cores_each": _each(used, "gateway", wall),
            }
            if "gateway" in used
            else {}
        ),
        **({"spans_received": counter.spans} if counter is not None else {}),
        loadgen_us_per_token=round(
            sum(c["cpu_s"] for c in res["clients"]) / max(tokens, 1) * 1e6, 2
        ),
    )


def _sum(used: dict[str, float], kind: str) -> float:
    """CPU seconds of every process of one kind (frontend, frontend-2, ...)."""
    return sum(v for k, v in used.items() if k.split("-")[0] == kind)


def _each(used: dict[str, float], kind: str, wall: float) -> list[float]:
    """Cores of each process of one kind, in start order: how evenly the connections spread."""
    return [round(v / wall, 2) for k, v in used.items() if k.split("-")[0] == kind]


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.client_channels < 1:
        parser.error("--client-channels must be at least 1")
    if args.stand_in_worker:
        asyncio.run(serve_stand_in(args.model, args.step_ms))
        return
    res = measure(args)
    if args.json:
        print(json.dumps(res), flush=True)
    else:
        for k, v in res.items():
            print(f"{k:<24} {v}")


if __name__ == "__main__":
    main()
