"""WorkerService over gRPC: token ids in, streams of token-id deltas out, on top of AsyncEngine.

The worker is a trust boundary: it re-validates every request. Health reports NOT_SERVING until the
engine is loaded and while draining; a dead engine makes the process exit non-zero.
"""
import asyncio
import logging
import os
import signal
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve.errors import Aborted, InvalidArgument, ResourceExhausted, Unavailable, grpc_errors
from nanoserve.grpc_options import server_options
from nanoserve.model_files import tokenizer_digest
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from nanoserve.request_decoding import DecodeErrorInterceptor
from nanoserve.worker.async_engine import AsyncEngine, EngineDead, RequestAborted
from nanoserve.worker.config import WorkerConfig
from nanoserve.worker.engine.sequence import FinishReason
from nanoserve.worker.sampling_params import SamplingParams
from nanoserve.worker.validation import check_request_sizes, max_request_bytes

logger = logging.getLogger(__name__)
SERVICE_NAME = "nanoserve.v1.WorkerService"
_FINISH = {FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
           FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH}


def sampling_params_from_proto(p: common_pb2.SamplingParams, prompt_len: int,
                               max_model_len: int) -> SamplingParams:
    """Proto -> engine params; unset fields take vLLM's defaults, bad values raise ValueError."""
    kw = {name: getattr(p, name) for name in (
        "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "ignore_eos",
        "repetition_penalty", "presence_penalty", "frequency_penalty") if p.HasField(name)}
    kw.setdefault("max_tokens", max(1, max_model_len - prompt_len))  # unset: fill the context
    return SamplingParams(stop_token_ids=tuple(p.stop_token_ids), **kw)


class WorkerServicer(worker_grpc.WorkerServiceServicer):

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.engine: AsyncEngine | None = None  # set once the model is loaded
        self.draining = False
        self.digest = tokenizer_digest(config.model) if config.model else ""

    def _ready(self) -> AsyncEngine:
        if self.engine is None:
            raise Unavailable("the worker is still loading the model")
        if self.draining:
            raise Unavailable("the worker is shutting down")
        if self.engine.error is not None:
            raise Unavailable("the engine has failed")
        return self.engine

    @grpc_errors
    async def GenerateTokens(self, request, context):
        """Stream the ids generated for one request; cancelling the call aborts it."""
        engine = self._ready()
        if engine.num_requests >= self.config.max_queued_requests:
            raise ResourceExhausted(f"{engine.num_requests} requests are in flight "
                                    f"(max_queued_requests={self.config.max_queued_requests})")
        check_request_sizes(request, engine.engine.max_model_len, self.config.max_stop_token_ids)
        token_ids = list(request.prompt_token_ids)
        request_id = request.request_id or uuid.uuid4().hex
        try:
            sp = sampling_params_from_proto(request.sampling_params, len(token_ids),
                                            engine.engine.max_model_len)
            stream = engine.add(request_id, token_ids, sp)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        done = False
        try:
            while not done:
                delta = await stream.queue.get()
                ids = []
                while True:  # coalesce what arrived while the client was slow
                    if isinstance(delta, EngineDead):
                        raise Unavailable(f"the engine failed: {delta}")
                    if isinstance(delta, RequestAborted):
                        raise Aborted(str(delta))
                    ids.extend(delta.token_ids)
                    if delta.seq is not None:
                        done = True
                        break
                    if stream.queue.empty():
                        break
                    delta = stream.queue.get_nowait()
                response = worker_pb2.GenerateTokensResponse(token_ids=ids)
                if done:
                    seq = delta.seq
                    response.finish_reason = _FINISH[seq.finish_reason]
                    response.usage.prompt_tokens = seq.num_prompt_tokens
                    response.usage.completion_tokens = seq.num_completion_tokens
                    response.usage.cached_tokens = seq.num_cached_tokens
                    if seq.stop_token_id is not None:
                        response.stop_token_id = seq.stop_token_id
                yield response
        finally:
            if not done:  # cancelled, deadline, error, abort: free the blocks now
                engine.release(stream)

    @grpc_errors
    async def Abort(self, request, context):
        """Abort requests by id; unknown ids are ignored."""
        engine = self._ready()
        return worker_pb2.AbortResponse(num_aborted=sum(engine.abort(r) for r in request.request_ids))

    @grpc_errors
    async def GetModelInfo(self, request, context):
        """The limits a frontend validates against."""
        e = self._ready().engine
        return worker_pb2.WorkerServiceGetModelInfoResponse(
            model_name=Path(self.config.model).name, max_model_len=e.max_model_len,
            vocab_size=e.model_config.vocab_size, eos_token_ids=list(e.eos_token_ids),
            kvcache_block_size=e.block_size, num_kvcache_blocks=e.num_kvcache_blocks,
            tensor_parallel_size=self.config.tensor_parallel_size, tokenizer_digest=self.digest,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            dtype=str(e.model_runner.dtype).removeprefix("torch."),
            device=str(e.model_runner.device))

    @grpc_errors
    async def GetLoad(self, request, context):
        """Queue lengths, KV blocks, prefix-cache hit rate and recent throughput."""
        a = self._ready()
        s, bm = a.engine.scheduler, a.engine.block_manager
        prompt_rate, gen_rate = a.rates()
        return worker_pb2.GetLoadResponse(
            num_running=len(s.running), num_waiting=len(s.waiting),
            num_free_blocks=bm.num_free_blocks, num_total_blocks=bm.num_blocks,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate, generation_tokens_per_s=gen_rate,
            prompt_tokens_per_s=prompt_rate, num_preemptions=s.num_preemptions,
            num_finished=a.num_finished)


async def serve(config: WorkerConfig) -> int:
    """Run the worker until SIGTERM/SIGINT (exit 0) or an engine failure (exit 1)."""
    loop = asyncio.get_running_loop()
    too_large = max_request_bytes(config.max_model_len, config.max_stop_token_ids)
    guard = DecodeErrorInterceptor(too_large, "5 bytes * (max_model_len + max_stop_token_ids)")
    server = grpc.aio.server(interceptors=[guard], options=server_options(config.max_message_bytes))
    servicer = WorkerServicer(config)
    worker_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise ValueError(f"port: cannot bind {config.host}:{config.port}")
    await server.start()
    print(f"worker listening on {config.host}:{port}", flush=True)
    if config.metrics_port:  # prometheus_client is imported only when asked for
        from nanoserve.worker.metrics import serve_worker_metrics
        serve_worker_metrics(servicer, Path(config.model).name, config.metrics_port, config.host)

    stop = asyncio.Event()
    exit_code = 0

    def on_fatal(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    from nanoserve.worker.engine.llm_engine import (
        LLMEngine,  # torch is imported here, after the port is bound
    )
    load = asyncio.ensure_future(asyncio.to_thread(LLMEngine, config))
    await asyncio.wait([load, asyncio.ensure_future(stop.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    if not load.done():
        logger.info("stopped while loading")
        await server.stop(0)
        return 0
    engine = load.result()  # a load error propagates: the process exits non-zero
    servicer.engine = async_engine = AsyncEngine(engine, loop, on_fatal)
    engine.model_runner.on_rank_death = lambda message: loop.call_soon_threadsafe(
        async_engine.fail, RuntimeError(message))  # tensor parallel: a dead rank ends the worker
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info("serving %s (%d KV blocks)", config.model, engine.num_kvcache_blocks)

    await stop.wait()
    servicer.draining = True
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if exit_code == 0:
        deadline = loop.time() + config.grace_period_s
        while servicer.engine.num_requests and loop.time() < deadline:
            await asyncio.sleep(0.05)
        logger.info("draining done (%d streams cut)", servicer.engine.num_requests)
    await server.stop(0.5)
    if exit_code:  # the engine thread may be stuck in a collective: do not wait for it
        engine.model_runner.kill()  # tensor-parallel ranks go too
        return exit_code
    servicer.engine.stop()
    engine.shutdown()
    return exit_code


def main(argv: list[str] | None = None) -> None:
    from nanoserve.config import parse_config
    from nanoserve.log import setup_logging
    config = parse_config(WorkerConfig, argv)
    setup_logging("worker", config.log_level)
    if not config.model:
        import dataclasses

        from nanoserve.tiny_model import default_model_dir
        config = dataclasses.replace(config, model=str(default_model_dir()))
    code = asyncio.run(serve(config))
    if code:  # an engine failure: exit now, whatever threads or ranks are stuck
        logging.shutdown()
        os._exit(code)
