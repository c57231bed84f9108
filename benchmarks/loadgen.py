"""The serving benchmark's load generator: streams requests to FrontendService.Generate or
WorkerService.GenerateTokens over plain grpc.aio, or to the OpenAI gateway's /v1/completions or
/v1/chat/completions (gateway_stream.py), and times every response message. Several client
processes (spawned, results back as JSON) when one event loop would be the bottleneck; each reports
its own CPU time so that the figures say whether it was. Each process may open several gRPC
channels (separate TCP connections): the kernel hands each connection whole to one of the
frontend processes sharing a port (SO_REUSEPORT), so a few connections load them unevenly.
"""

import asyncio
import contextlib
import json
import multiprocessing as mp
import queue
import resource
import threading
import time
from dataclasses import asdict

import grpc

from nanoserve.benchmarks.gateway_stream import GatewayError, starter
from nanoserve.benchmarks.workload import Request
from nanoserve.grpc_options import channel_options
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc

HTTP_TARGETS = ("gateway", "chat")  # the OpenAI gateway's /v1/completions, /v1/chat/completions
TARGETS = ("frontend", "worker", *HTTP_TARGETS)
CLIENT_KEYS = ("cpu_s", "wall_s", "max_rss_mib")  # what each client process reports of itself


def _call(target: str, channel: grpc.aio.Channel, temperature: float, detokenize: bool = True):
    """A function Request -> streaming call on the target's public generate RPC; `detokenize`
    false asks the frontend for ids only (SamplingParams.detokenize)."""
    if target == "frontend":
        generate = frontend_grpc.FrontendServiceStub(channel).Generate

        def start(r: Request):
            return generate(
                frontend_pb2.GenerateRequest(
                    prompt_token_ids=r.prompt_token_ids,
                    request_id=r.request_id,
                    sampling_params=common_pb2.SamplingParams(
                        temperature=temperature,
                        max_tokens=r.max_tokens,
                        ignore_eos=True,
                        detokenize=detokenize,
                    ),
                )
            )
    elif target == "worker":
        generate_tokens = worker_grpc.WorkerServiceStub(channel).GenerateTokens

        def start(r: Request):
            return generate_tokens(
                worker_pb2.GenerateTokensRequest(
                    prompt_token_ids=r.prompt_token_ids,
                    request_id=r.request_id,
                    sampling_params=common_pb2.SamplingParams(
                        temperature=temperature, max_tokens=r.max_tokens, ignore_eos=True
                    ),
                )
            )
    else:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    return start


def _channel_options(channels: int) -> list[tuple[str, int]]:
    """grpc core shares one subchannel (one TCP connection) among all channels of a process to
    the same address with identical args (its global subchannel pool): several channels then each
    get a pool of their own, hence a connection of their own. One channel keeps the plain options."""
    local_pool = [("grpc.use_local_subchannel_pool", 1)] if channels > 1 else []
    return [*channel_options(), *local_pool]


async def _one(start, r: Request, t0: float) -> dict:
    """Send one request at its arrival time (seconds after t0) and time every message that carries
    tokens: TTFT, the gaps between messages (inter-token latency), the end."""
    delay = t0 + r.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    times: list[float] = []
    tokens, first_tokens = 0, 0
    error = ""
    try:
        async for response in start(r):
            n = len(response.token_ids)
            if n:
                times.append(time.perf_counter())
                tokens += n
                first_tokens = first_tokens or n
    except grpc.RpcError as e:
        error = f"{e.code().name}: {e.details()}"
    except (GatewayError, OSError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    return dict(
        prompt_len=len(r.prompt_token_ids),
        max_tokens=r.max_tokens,
        tokens=tokens,
        first_tokens=first_tokens,
        messages=len(times),
        sent=sent - t0,
        end=end - t0,
        sent_at=sent,  # perf_counter: the step loop's watch (benchmarks.step_loop_watch) reads it
        end_at=end,
        ttft=times[0] - sent if times else None,
        gaps=[round(b - a, 6) for a, b in zip(times, times[1:])],
        error=error,
    )


async def run(
    target: str,
    address: str,
    requests: list[Request],
    temperature: float,
    sequential: bool = False,
    barrier=None,
    channels: int = 1,
    detokenize: bool = True,
) -> dict:
    """Run `requests` dealt round-robin over `channels` gRPC channels (each its own connection):
    all concurrently at their arrival times, or one after another (each sent when the previous
    ends). `barrier` (multiprocessing) starts every client process's clock together, once all are
    connected. The gateway target ignores `channels` (HTTP: a connection per request)."""
    async with contextlib.AsyncExitStack() as stack:
        if target in HTTP_TARGETS:
            if not detokenize:
                raise ValueError("the OpenAI gateway streams text: detokenize must stay on")
            starts = [await starter(address, temperature, chat=target == "chat")]
        else:
            starts = []
            for _ in range(channels):
                channel = await stack.enter_async_context(
                    grpc.aio.insecure_channel(address, options=_channel_options(channels))
                )
                await asyncio.wait_for(channel.channel_ready(), 60)
                starts.append(_call(target, channel, temperature, detokenize))
        if barrier is not None:
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        cpu0, t0 = time.process_time(), time.perf_counter()
        if sequential:
            results = []
            for i, r in enumerate(requests):
                start = starts[i % len(starts)]
                results.append(await _one(start, r, time.perf_counter() - r.arrival_s))
        else:
            results = await asyncio.gather(
                *(_one(starts[i % len(starts)], r, t0) for i, r in enumerate(requests))
            )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return dict(
        results=list(results),
        wall_s=wall,
        cpu_s=cpu,
        max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )


def _client_main(spec: str, barrier, out) -> None:
    """A spawned client process: spec and result are JSON strings."""
    s = json.loads(spec)
    requests = [Request(**r) for r in s["requests"]]
    try:
        res = asyncio.run(
            run(
                s["target"],
                s["address"],
                requests,
                s["temperature"],
                barrier=barrier,
                channels=s["channels"],
                detokenize=s["detokenize"],
            )
        )
    except Exception as e:  # noqa: BLE001 - reported, not raised: the parent must not wait forever
        barrier.abort()
        res = dict(error=f"{type(e).__name__}: {e}")
    out.put(json.dumps(res))


def _start_together(barrier, children: list, timeout_s: float = 120.0) -> None:
    """Wait until every client is connected, so that their clocks start together. A client that
    failed breaks the barrier itself (its error is in the queue); one that died before it could
    (killed, or its spawn's imports failed) is seen by its exit code, and the barrier is broken
    for it rather than waited on to its timeout."""

    def wait() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=timeout_s)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.5)
        if any(p.exitcode not in (None, 0) for p in children):
            barrier.abort()


def run_processes(
    target: str,
    address: str,
    requests: list[Request],
    temperature: float,
    procs: int,
    timeout_s: float = 1800.0,
    channels: int = 1,
    detokenize: bool = True,
) -> dict:
    """`requests` dealt round-robin over `procs` spawned client processes that start together,
    each with `channels` gRPC channels; their results merged (per-process CPU and wall listed).
    procs=1 runs in this process."""
    if procs <= 1:
        res = asyncio.run(
            run(target, address, requests, temperature, channels=channels, detokenize=detokenize)
        )
        return dict(
            results=res["results"], wall_s=res["wall_s"], clients=[{k: res[k] for k in CLIENT_KEYS}]
        )
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    children = []
    for k in range(procs):
        spec = json.dumps(
            dict(
                target=target,
                address=address,
                temperature=temperature,
                channels=channels,
                detokenize=detokenize,
                requests=[asdict(r) for r in requests[k::procs]],
            )
        )
        p = ctx.Process(target=_client_main, args=(spec, barrier, out), daemon=True)
        p.start()
        children.append(p)
    try:
        _start_together(barrier, children)
        parts: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while len(parts) < procs:
            try:
                parts.append(json.loads(out.get(timeout=1.0)))
            except queue.Empty:
                dead = [p.exitcode for p in children if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"client processes: exit codes {dead} or past {timeout_s:.0f} s"
                    ) from None
    finally:
        for p in children:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [p["error"] for p in parts if "error" in p]
    if errors:
        raise RuntimeError(f"client process failed: {errors[0]}")
    return dict(
        results=[r for p in parts for r in p["results"]],
        wall_s=max(p["wall_s"] for p in parts),
        clients=[{k: p[k] for k in CLIENT_KEYS} for p in parts],
    )
