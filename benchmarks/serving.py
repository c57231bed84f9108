"""`nanoserve bench serving`: the same workload offline (LLM.generate) and through the real services
(frontend + worker processes on loopback, one AsyncClient stream per request), so the cost of the gRPC
path shows; meanwhile a prober measures the worker's health-check round trip, i.e. how long its event
loop can be kept waiting by the engine. Prints figures, asserts nothing.
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def workload(args, vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(args.min_len, args.max_len))]
               for _ in range(args.num_seqs)]
    outputs = [rng.randint(args.min_out, args.max_out) for _ in range(args.num_seqs)]
    return prompts, outputs


def run_offline(args, model: str) -> tuple[float, int]:
    from nanoserve.worker import LLM, SamplingParams
    llm = LLM(model, device=args.device, kvcache_block_size=args.kvcache_block_size)
    prompts, outputs = workload(args, llm.model_config.vocab_size)
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=n) for n in outputs]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    llm.block_manager.hash_to_block_id.clear()
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    llm.shutdown()
    return dt, sum(outputs)


async def run_served(args, frontend: str, worker: str, vocab: int) -> dict:
    from nanoserve.client import AsyncClient
    prompts, outputs = workload(args, vocab)
    rtts: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with grpc.aio.insecure_channel(worker) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not done.is_set():
                t = time.perf_counter()
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                rtts.append(time.perf_counter() - t)
                await asyncio.sleep(0.01)

    async with AsyncClient(frontend) as client:
        await client.generate(prompts[0][:8], max_tokens=2, temperature=0)  # warm-up
        prober = asyncio.ensure_future(probe())
        t = time.perf_counter()
        results = await asyncio.gather(*(
            client.generate(p, max_tokens=n, temperature=0, ignore_eos=True)
            for p, n in zip(prompts, outputs)))
        dt = time.perf_counter() - t
        done.set()
        await prober
    tokens = sum(len(r.token_ids) for r in results)
    rtts.sort()
    return dict(seconds=dt, tokens=tokens, probes=len(rtts),
                health_rtt_ms_p50=round(1000 * statistics.median(rtts), 2),
                health_rtt_ms_p99=round(1000 * rtts[int(0.99 * (len(rtts) - 1))], 2),
                health_rtt_ms_max=round(1000 * rtts[-1], 2))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="nanoserve bench serving", description=__doc__)
    p.add_argument("--model", default="", help="model directory with tokenizer files "
                   "(default: the embedded tiny model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--kvcache-block-size", type=int, default=256)
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--min-len", type=int, default=20)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--min-out", type=int, default=32)
    p.add_argument("--max-out", type=int, default=128)
    args = p.parse_args(argv)
    from nanoserve.process import FRONTEND_SERVICE, WORKER_SERVICE, Child, is_serving as _serving
    from nanoserve.model_files import read_json
    model = args.model
    if not model:
        from nanoserve.tiny.model import default_model_dir
        model = str(default_model_dir())
    vocab = read_json(f"{model}/config.json")["vocab_size"]

    offline_s, tokens = run_offline(args, model)
    py = [sys.executable, "-m"]
    worker = Child("worker", [*py, "worker", "--model", model, "--port", "0", "--device",
                              args.device, "--kvcache-block-size", str(args.kvcache_block_size),
                              "--log-level", "WARNING"])
    children = [worker]
    try:
        deadline = time.monotonic() + 600
        while not (worker.listening.is_set() and _serving(worker.address, WORKER_SERVICE)):
            if not worker.alive() or time.monotonic() > deadline:
                raise SystemExit("the worker did not come up")
            time.sleep(0.2)
        frontend = Child("frontend", [*py, "frontend", "--model", model, "--port", "0",
                                      "--worker-address", worker.address])
        children.insert(0, frontend)
        while not (frontend.listening.is_set() and _serving(frontend.address, FRONTEND_SERVICE)):
            if not frontend.alive() or time.monotonic() > deadline:
                raise SystemExit("the frontend did not come up")
            time.sleep(0.2)
        served = asyncio.run(run_served(args, frontend.address, worker.address, vocab))
    finally:
        for child in children:
            child.stop()
    res = dict(bench="serving", model=model, requests=args.num_seqs, output_tokens=tokens,
               offline_tok_s=round(tokens / offline_s, 1),
               served_tok_s=round(served["tokens"] / served["seconds"], 1),
               grpc_overhead=round(1 - (served["tokens"] / served["seconds"]) / (tokens / offline_s), 3),
               **{k: v for k, v in served.items() if k.startswith("health") or k == "probes"})
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
