"""`nanoserve bench worker-cost`: the worker's CPU per streamed token, measured without a GPU.

The real worker (its gRPC process, engine core, scheduler and block manager) runs with a stand-in
model runner that answers every step on a fixed cadence (`--step-ms`, one random id for each
sequence that samples) instead of forwarding a model. The load generator streams Generate calls
through a real frontend (the Session path) or GenerateTokens straight to the worker. The figures:
CPU µs per output token and cores of the worker's gRPC process and of its engine core, apart.
"""

import argparse
import json
import os
import random
import sys
import time
import types

STEP_MS_ENV = "NANOSERVE_STAND_IN_STEP_MS"


class StandInRunner:
    """What LLMEngine asks of a ModelRunner, with no model: a step takes `step_ms` (a fixed
    cadence: a late step goes at once, with at most one step of debt), and each sequence that
    samples gets a random id."""

    uses_lookahead = False
    holds_foreseen = False
    dtype, device = "bfloat16", "stand-in"

    def __init__(self, config, model_config) -> None:
        self.step_s = float(os.environ.get(STEP_MS_ENV, "7")) / 1000
        self.num_kvcache_blocks = config.num_kvcache_blocks or 4096
        self.max_model_len = config.max_model_len or model_config.max_position_embeddings
        self.on_rank_death = None
        self.deadline = time.monotonic()
        self.rng = random.Random(0)

    def run(self, seqs, is_prefill: bool, lookahead: bool = False, plan=None) -> list[int | None]:
        self.deadline = max(self.deadline + self.step_s, time.monotonic() - self.step_s)
        time.sleep(max(0.0, self.deadline - time.monotonic()))
        return [self.rng.randrange(1000, 30000) if s.samples_this_step else None for s in seqs]

    def copy_blocks(self, copies) -> None:
        pass

    def release(self, seq) -> None:
        pass

    def close(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def explain(self, exc: BaseException) -> BaseException:
        return exc


def stand_in_core(config, inbox, outbox) -> None:
    """The engine core process's entry with StandInRunner in place of the model runner."""
    module = types.ModuleType("nanoserve.worker.runner.model_runner")
    module.ModelRunner = StandInRunner  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    from nanoserve.worker.core.engine_core import run_engine_core

    run_engine_core(config, inbox, outbox)


def serve_worker(argv: list[str]) -> None:
    """`python -m nanoserve.worker ARGV` whose engine core runs stand_in_core (spawned: the child
    imports this module to find it)."""
    from nanoserve.benchmarks.worker_cost import stand_in_core as core  # not __main__'s
    from nanoserve.worker import __main__ as worker_main
    from nanoserve.worker.core import engine_core

    engine_core.run_engine_core = core  # type: ignore[assignment]
    worker_main.main(argv)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench worker-cost", description=__doc__)
    p.add_argument("--model", default="tiny", help="config and tokenizer (default: tiny)")
    p.add_argument("--step-ms", type=float, default=7.0, help="the stand-in's step")
    p.add_argument("--num-prompts", type=int, default=256, help="concurrent requests")
    p.add_argument("--max-tokens", type=int, default=200, help="output tokens of each request")
    p.add_argument("--prompt-len", type=int, default=100, help="prompt tokens of each request")
    p.add_argument("--client-procs", type=int, default=2, help="load generator processes")
    p.add_argument(
        "--target",
        choices=["frontend", "worker"],
        default="frontend",
        help="through a frontend (its Session to the worker) or GenerateTokens straight to it",
    )
    p.add_argument("--worker-args", default="", help="more worker flags")
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.add_argument(
        "--stand-in-worker",
        nargs=argparse.REMAINDER,
        help="serve as the worker with the stand-in runner, these worker flags (internal)",
    )
    return p


def measure(args: argparse.Namespace) -> dict:
    from nanoserve.benchmarks.loadgen import run_processes
    from nanoserve.benchmarks.process_counters import one_process, tree_counters
    from nanoserve.benchmarks.services import Service, tree_cpu_s
    from nanoserve.benchmarks.workload import Request

    os.environ[STEP_MS_ENV] = str(args.step_ms)  # the worker's engine core reads it
    worker = Service(
        "worker",
        [sys.executable, "-m", "nanoserve.benchmarks.worker_cost", "--stand-in-worker",
         "--model", args.model, "--device", "cpu", "--port", "0", "--max-num-seqs", "1024",
         *args.worker_args.split()],
    )  # fmt: skip
    services = [worker]
    try:
        address = worker.wait_serving(120)
        if args.target == "frontend":
            frontend = Service(
                "frontend",
                [sys.executable, "-m", "nanoserve.frontend", "--model", args.model,
                 "--worker-address", address, "--port", "0"],
            )  # fmt: skip
            services.append(frontend)
            address = frontend.wait_serving(120)
        rng = random.Random(0)

        def requests(tag: str, n: int, max_tokens: int) -> list[Request]:
            ids = [[rng.randrange(1000, 30000) for _ in range(args.prompt_len)] for _ in range(n)]
            return [Request(f"{tag}-{i}", p, max_tokens, 0.0) for i, p in enumerate(ids)]

        run_processes(args.target, address, requests("warm", 32, 8), 0.0, 1)
        pid = worker.process.pid
        own0, tree0 = one_process(pid)["cpu_s"], tree_counters(pid)["cpu_s"]
        front0 = tree_cpu_s(services[-1].process.pid) if args.target == "frontend" else 0.0
        res = run_processes(
            args.target,
            address,
            requests("run", args.num_prompts, args.max_tokens),
            0.0,
            args.client_procs,
        )
        own = one_process(pid)["cpu_s"] - own0
        core = tree_counters(pid)["cpu_s"] - tree0 - own
        front = tree_cpu_s(services[-1].process.pid) - front0 if args.target == "frontend" else 0
    finally:
        for s in reversed(services):
            s.stop()
    wall = res["wall_s"]
    tokens = sum(r["tokens"] for r in res["results"])
    per_token = 1e6 / max(tokens, 1)
    ceiling = args.num_prompts / (args.step_ms / 1000)
    return dict(
        bench="worker_cost",
        target=args.target,
        requests=args.num_prompts,
        output_tokens=tokens,
        errors=sum(1 for r in res["results"] if r.get("error")),
        tok_s=round(tokens / wall, 1),
        ceiling_tok_s=round(ceiling, 1),
        fraction_of_ceiling=round(tokens / wall / ceiling, 3),
        messages_per_token=round(sum(r["messages"] for r in res["results"]) / max(tokens, 1), 3),
        worker_grpc_us_per_token=round(own * per_token, 2),
        worker_grpc_cores=round(own / wall, 2),
        engine_core_us_per_token=round(core * per_token, 2),
        engine_core_cores=round(core / wall, 2),
        **(
            {
                "frontend_us_per_token": round(front * per_token, 2),
                "frontend_cores": round(front / wall, 2),
            }
            if args.target == "frontend"
            else {}
        ),
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.stand_in_worker is not None:
        return serve_worker(args.stand_in_worker)
    res = measure(args)
    if args.json:
        print(json.dumps(res), flush=True)
    else:
        for k, v in res.items():
            print(f"{k:<26} {v}")


if __name__ == "__main__":
    main()
