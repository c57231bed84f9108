"""One path of `nanoserve bench serving` measured: warm-up, --runs throughput runs of fresh prompt ids
(each with its services' CPU, syscalls and context switches per token), then the one-stream runs.
"""

import asyncio
from statistics import median

import grpc

from nanoserve.benchmarks import loadgen, workload
from nanoserve.benchmarks.process_counters import Profiler, one_process, per_token, tree_counters
from nanoserve.benchmarks.stats import summarize, summarize_by_bucket
from nanoserve.benchmarks.step_loop_watch import StepLoopWatch, engine_core_pid

SATURATED = 0.8  # CPU cores a load-generator process may use before it may be the bottleneck


def model_info(target: str, address: str):
    """GetModelInfo of the frontend or the worker (vocab_size, tensor_parallel_size, model_name)."""
    from nanoserve.proto.v1 import frontend_service_pb2 as fpb
    from nanoserve.proto.v1 import frontend_service_pb2_grpc as fgrpc
    from nanoserve.proto.v1 import worker_service_pb2 as wpb
    from nanoserve.proto.v1 import worker_service_pb2_grpc as wgrpc

    with grpc.insecure_channel(address) as channel:
        if target == "frontend":
            info = fgrpc.FrontendServiceStub(channel).GetModelInfo(
                fpb.GetModelInfoRequest(), timeout=30
            )
        else:
            info = wgrpc.WorkerServiceStub(channel).GetModelInfo(
                wpb.WorkerServiceGetModelInfoRequest(), timeout=30
            )
    return info


def tpot(r: dict) -> float:
    """Seconds per output token after the first message (the decode pace, TTFT left out)."""
    return sum(r["gaps"]) / (r["tokens"] - r["first_tokens"])


def throughput_run(
    target: str, address: str, requests: list, args, services: dict[str, int], tag: str
) -> dict:
    """One throughput run: its figures, each service tree's cores, CPU, syscalls and context
    switches per output token, and (--profile-dir) each service's top py-spy frames."""
    before = {name: tree_counters(pid) for name, pid in services.items()}
    worker_pid = services.get("worker")
    worker_own = one_process(worker_pid)["cpu_s"] if worker_pid else 0.0
    profiler = Profiler(args.profile_dir, services, tag)
    run = loadgen.run_processes(
        target,
        address,
        requests,
        args.temperature,
        args.client_procs,
        channels=args.client_channels,
    )
    frames = profiler.stop()
    res = run["results"]
    ok = [r for r in res if not r["error"]]
    tokens = sum(r["tokens"] for r in ok)
    edges = [int(x) for x in args.ttft_buckets.split(",") if x]
    clients = run["clients"]
    out = dict(
        tok_s=round(tokens / run["wall_s"], 1),
        seconds=round(run["wall_s"], 3),
        output_tokens=tokens,
        requests=len(res),
        errors=len(res) - len(ok),
        first_error=next((r["error"] for r in res if r["error"]), ""),
        messages_per_token=round(sum(r["messages"] for r in ok) / max(1, tokens), 3),
        ttft_ms=summarize((r["ttft"] for r in ok if r["ttft"] is not None), 1000),
        itl_ms=summarize((g for r in ok for g in r["gaps"]), 1000),
        tpot_ms=summarize((tpot(r) for r in ok if r["tokens"] > r["first_tokens"]), 1000),
        ttft_ms_by_prompt_len=summarize_by_bucket(
            ((r["prompt_len"], r["ttft"]) for r in ok if r["ttft"] is not None), edges, 1000
        ),
        loadgen=dict(
            procs=len(clients),
            cpu_s=round(sum(c["cpu_s"] for c in clients), 2),
            max_rss_mib=round(max(c["max_rss_mib"] for c in clients)),
            busiest_proc_cpu=round(max(c["cpu_s"] / c["wall_s"] for c in clients), 2),
        ),
        services={
            name: per_token(before[name], tree_counters(pid), run["wall_s"], tokens)
            for name, pid in services.items()
        },
    )
    out["service_cpu_cores"] = {name: s["cores"] for name, s in out["services"].items()}
    if worker_pid:
        # the worker's tree is its gRPC process and the engine core (with its TP ranks), which on
        # a GPU spins in CUDA syncs: the gRPC process's own share, apart
        own_s = one_process(worker_pid)["cpu_s"] - worker_own
        out["worker_grpc_process"] = dict(
            cores=round(own_s / run["wall_s"], 2),
            cpu_us_per_token=round(own_s / max(tokens, 1) * 1e6, 1),
        )
    if frames:
        out["profile_top_frames"] = frames
    # a client process near one core is the bottleneck itself: raise --client-procs
    out["loadgen"]["saturated"] = out["loadgen"]["busiest_proc_cpu"] > SATURATED
    return out


def measure(
    target: str,
    address: str,
    shape: list,
    warmup: list,
    args,
    services: dict[str, int],
    frontend_address: str = "",
) -> dict:
    """Warm-up (unless --warmup none) and one-stream runs after it, --runs throughput runs of fresh
    prompt ids (the worst run's figures, every run's throughput and per-service spend, min and
    median), then the one-stream runs again, on one target."""
    # the gateway's model is the frontend's (the HTTP API has no vocab_size)
    vocab = (
        model_info("frontend", frontend_address)
        if target in loadgen.HTTP_TARGETS
        else model_info(target, address)
    ).vocab_size
    before: dict = {}
    if args.warmup != "none":
        loadgen.run_processes(
            target, address, workload.build(f"{target}-warmup", warmup, vocab), args.temperature, 1
        )
        # the one-stream pace before the throughput runs too: does a loaded stack stay slower?
        before = one_stream(target, address, vocab, args, "one-before", services.get("worker"))
    runs = [
        throughput_run(
            target,
            address,
            workload.build(target, shape, vocab, args.request_rate, seed=i),
            args,
            services,
            f"{target}-{i}",
        )
        for i in range(args.runs)
    ]
    out = dict(min(runs, key=lambda x: x["tok_s"]))  # the worst run's figures
    rates = [x["tok_s"] for x in runs]
    out.update(tok_s_runs=rates, tok_s_min=min(rates), tok_s_median=median(rates))
    out["runs"] = [
        dict(
            tok_s=x["tok_s"],
            ttft_p50_ms=x["ttft_ms"].get("p50"),
            itl_p50_ms=x["itl_ms"].get("p50"),
            itl_p99_ms=x["itl_ms"].get("p99"),
            messages_per_token=x["messages_per_token"],
            loadgen_busiest_proc_cpu=x["loadgen"]["busiest_proc_cpu"],
            services=x["services"],
            **(
                {"worker_grpc_process": x["worker_grpc_process"]}
                if "worker_grpc_process" in x
                else {}
            ),
            **(
                {"profile_top_frames": x["profile_top_frames"]} if "profile_top_frames" in x else {}
            ),
        )
        for x in runs
    ]
    out.update(one_stream(target, address, vocab, args, "one", services.get("worker")))
    if before:
        out["one_stream_before_runs"] = before
    return out


def one_stream(
    target: str, address: str, vocab: int, args, tag: str, worker_pid: int | None = None
) -> dict:
    """One stream at a time: a warm-up of the same prompt length, then the timed runs one after
    another; their median ms/token and TTFT, and every gap (a slower pace shows in p50, a few
    stalls in p99 and max). With the worker's pid (a worker this bench started, on this host): each
    probe's pace beside what the engine core's step loop did meanwhile (step_loop_watch)."""
    one = [(args.one_stream_prompt_len, args.one_stream_tokens)] * (args.one_stream_runs + 1)
    core = engine_core_pid(worker_pid) if worker_pid is not None else None
    watch = StepLoopWatch(core) if core is not None else None
    try:
        seq = asyncio.run(
            loadgen.run(
                target, address, workload.build(f"{target}-{tag}", one, vocab), 0.0, sequential=True
            )
        )
    finally:
        if watch is not None:
            watch.stop()
    timed = [r for r in seq["results"][1:] if not r["error"] and r["tokens"] > r["first_tokens"]]
    if not timed:
        return {}
    out = dict(
        one_stream_ms_per_token=round(1000 * median(tpot(r) for r in timed), 3),
        one_stream_ttft_ms=round(1000 * median(r["ttft"] for r in timed), 2),
        one_stream_gap_ms=summarize((g for r in timed for g in r["gaps"]), 1e3),
    )
    if watch is not None:
        out["one_stream_probes"] = [
            dict(
                ms_per_token=round(1000 * tpot(r), 3),
                step_loop=watch.window(r["sent_at"], r["end_at"]),
            )
            for r in timed
        ]
    return out
