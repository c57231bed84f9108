"""FrontendServer's health against a fake worker: a lost or mismatched worker, a broken session,
graceful drain, reflection."""

import asyncio
import re
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.text.tokenizer import Tokenizer
from tests.unit.frontend_fakes import (
    OUTPUT,
    Harness,
    _collect,
    _generate,
    _health,
    _read_rest,
    _start_worker,
    _wait_health,
    run,
)


def test_worker_down_is_unavailable_fast(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    """A call right after the worker stopped fails at once, whether or not the link saw it go:
    the refused reconnect ends the wait, not worker_connect_timeout_s (5 s here)."""

    async def test(h: Harness) -> None:
        await h.worker_server.stop(0)
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < 2.5, exc.value.details()
        await _wait_health(h, health_pb2.HealthCheckResponse.NOT_SERVING)
        # A worker back on the same port is found again and the model info re-fetched.
        port = int(h.frontend.config.worker_address.rsplit(":", 1)[1])
        h.fake.info.max_model_len = 48
        h.worker_server, _ = await _start_worker(h.fake, port)
        await _wait_health(h, health_pb2.HealthCheckResponse.SERVING)
        info = await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert info.max_model_len == 48

    run(test, tokenizer, tiny_model_dir, worker_connect_timeout_s=5.0)


def test_no_worker_not_serving(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await h.worker_server.stop(0)
        await _wait_health(h, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert (
            await _health(h, "nanoserve.v1.FrontendService")
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await h.stub.GetModelInfo(frontend_pb2.GetModelInfoRequest())
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        # Tokenize needs only the local tokenizer
        response = await h.stub.Tokenize(frontend_pb2.TokenizeRequest(text="hi 世界"))
        assert list(response.token_ids) == tokenizer.encode("hi 世界")

    run(test, tokenizer, tiny_model_dir)


def test_tokenizer_digest_mismatch_refuses(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        await asyncio.sleep(0.3)
        assert await _health(h) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "tokenizer" in exc.value.details()

    run(test, tokenizer, tiny_model_dir, digest="0" * 64, wait=False)


def test_broken_session_ends_every_stream_unavailable(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    """All requests share one Session stream to the worker; when it breaks, each ends UNAVAILABLE
    and the next request opens a new session."""

    async def test(h: Harness) -> None:
        h.fake.hang_after = 1
        calls = [h.stub.Generate(_generate(prompt="x", request_id=f"c{i}")) for i in range(3)]
        for call in calls:
            assert (await call.read()).token_ids
        # the worker sees the client's id (for its logs) made unique by the frontend
        assert sorted(r.request_id.partition("#")[0] for r in h.fake.requests) == ["c0", "c1", "c2"]
        assert all(
            re.fullmatch(r"[0-9a-f]{8}-\d+", r.request_id.partition("#")[2])
            for r in h.fake.requests
        )
        await h.worker_server.stop(0)
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        port = int(h.frontend.config.worker_address.rsplit(":", 1)[1])
        h.fake.hang_after = None
        h.worker_server, _ = await _start_worker(h.fake, port)
        await _wait_health(h, health_pb2.HealthCheckResponse.SERVING)
        responses = await _collect(h.stub.Generate(_generate(prompt="again")))
        assert "".join(r.text for r in responses) == OUTPUT

    run(test, tokenizer, tiny_model_dir)


def test_graceful_stop_lets_streams_finish(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    async def test(h: Harness) -> None:
        watch = h.health.Watch(
            health_pb2.HealthCheckRequest(service="nanoserve.v1.FrontendService")
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        call = h.stub.Generate(_generate(prompt="x"))
        await call.read()
        stopping = asyncio.create_task(h.frontend.stop(5))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await _health(h) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as exc:  # new calls are refused while draining
            await _collect(h.stub.Generate(_generate(prompt="x")))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        rest = await _read_rest(call)  # the call in flight finishes
        assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        await asyncio.wait_for(stopping, 2)  # without waiting out the grace period

    run(test, tokenizer, tiny_model_dir)


def test_handoff_stop_lets_a_call_it_has_not_counted_yet_finish(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    """--reuse-port: gRPC's graceful stop alone decides when the drain ends. A call the server
    took just before the GOAWAY but had not yet counted in flight (here held before its
    admission) streams for longer than a second and still finishes; it used to be cut (CANCELLED)
    a second after the in-flight count first read 0 (a rolling-restart flake)."""

    async def test(h: Harness) -> None:
        h.fake.chunk_delay_s = 0.15  # ~10 chunks: a stream of ~1.5 s
        servicer = h.frontend.servicer
        limits, entered = servicer._limits, asyncio.Event()

        async def late_limits():  # the call is in its handler, not yet admitted (uncounted)
            entered.set()
            await asyncio.sleep(0.3)
            return await limits()

        servicer._limits = late_limits
        call = h.stub.Generate(_generate(prompt="x"))
        await entered.wait()
        assert servicer.num_in_flight == 0
        started = time.monotonic()
        stopping = asyncio.create_task(h.frontend.stop(5))
        responses = await _read_rest(call)
        assert responses[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert "".join(r.text for r in responses) == OUTPUT
        await asyncio.wait_for(stopping, 2)
        assert time.monotonic() - started > 1.0  # the stream outlasted the old one-second cut

    run(test, tokenizer, tiny_model_dir, reuse_port=True)


def test_handoff_stop_ends_health_watches_after_not_serving(
    tokenizer: Tokenizer, tiny_model_dir: Path
) -> None:
    """--reuse-port: an open health Watch stream says NOT_SERVING and then ends (OK), so that the
    watcher re-watches on a new connection, which a port-sharing process takes, and the stream
    does not hold the graceful stop for the whole grace period."""

    async def test(h: Harness) -> None:
        watches = [
            h.health.Watch(health_pb2.HealthCheckRequest(service=service))
            for service in ("", "nanoserve.v1.FrontendService")
        ]
        for watch in watches:
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        started = time.monotonic()
        await asyncio.wait_for(h.frontend.stop(10), 3)
        assert time.monotonic() - started < 2.0
        for watch in watches:
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await watch.read() is grpc.aio.EOF
            assert await watch.code() == grpc.StatusCode.OK

    run(test, tokenizer, tiny_model_dir, reuse_port=True)


def test_reflection_lists_the_services(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def test(h: Harness) -> None:
        port = h.frontend.port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            response = await call.read()
            await call.done_writing()
        names = {s.name for s in response.list_services_response.service}
        assert {"nanoserve.v1.FrontendService", "grpc.health.v1.Health"} <= names

    run(test, tokenizer, tiny_model_dir)
