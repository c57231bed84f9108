"""The clients' retry policy (shared/client/connections.py): a call that reached a stopping
frontend's gRPC core while its event loop was busy is ended CANCELLED by gRPC, unrun; the channel
retries it on the other process sharing the port (the rolling-restart flake: reproduced here with
two servers on one port, one of them stopped with calls waiting in its core)."""

import asyncio
import json
import threading
import time
from collections import Counter

import grpc
import grpc.aio

from nanoserve.client.connections import RETRY_SERVICE_CONFIG, connection_options
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc


class SlowInfo(frontend_grpc.FrontendServiceServicer):
    async def GetModelInfo(self, request, context):
        await asyncio.sleep(0.05)
        return frontend_pb2.GetModelInfoResponse(model_name="m")


async def _server(port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    frontend_grpc.add_FrontendServiceServicer_to_server(SlowInfo(), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def _calls(
    port: int, options: list, connected: threading.Event, go: threading.Event, out: list[str]
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = frontend_grpc.FrontendServiceStub(channel)
        grpc.channel_ready_future(channel).result(10)
        connected.set()
        go.wait(10)
        futures = [
            stub.GetModelInfo.future(frontend_pb2.GetModelInfoRequest(), timeout=10)
            for _ in range(20)
        ]
        for future in futures:
            try:
                future.result()
                out.append("OK")
            except grpc.RpcError as e:
                out.append(e.code().name)


def _stop_with_calls_waiting(options: list) -> Counter:
    """A client connects to a server, a second server joins its port, then the first one's loop
    is kept busy while the client sends 20 calls (they wait in its core), and it stops."""

    async def main() -> Counter:
        first, port = await _server(0)
        connected, go, out = threading.Event(), threading.Event(), []
        client = threading.Thread(
            target=_calls, args=(port, options, connected, go, out), daemon=True
        )
        client.start()
        while not connected.is_set():  # its one connection: to `first`, the port's only server
            await asyncio.sleep(0.01)
        other_ready, other_stop = threading.Event(), threading.Event()

        def other() -> None:  # the port's second process, in a loop of its own
            async def serve() -> None:
                server, _ = await _server(port)
                other_ready.set()
                while not other_stop.is_set():
                    await asyncio.sleep(0.01)
                await server.stop(1)

            asyncio.run(serve())

        thread = threading.Thread(target=other, daemon=True)
        thread.start()
        other_ready.wait(10)
        go.set()
        time.sleep(1.0)  # noqa: ASYNC251 - the point: this loop busy, the calls wait in its core
        await first.stop(5)
        client.join(30)
        other_stop.set()
        thread.join(10)
        return Counter(out)

    return asyncio.run(main())


def test_the_retry_policy_names_the_frontend_service_and_cancelled_only() -> None:
    (policy,) = json.loads(RETRY_SERVICE_CONFIG)["methodConfig"]
    assert policy["name"] == [
        {"service": frontend_pb2.DESCRIPTOR.services_by_name["FrontendService"].full_name}
    ]
    assert policy["retryPolicy"]["retryableStatusCodes"] == ["CANCELLED"]
    assert ("grpc.service_config", RETRY_SERVICE_CONFIG) in connection_options([], 1)
    assert ("grpc.service_config", RETRY_SERVICE_CONFIG) in connection_options([], 3)


def test_calls_a_stopping_server_cancelled_unrun_are_retried_on_the_other() -> None:
    results = _stop_with_calls_waiting(connection_options([], 1))
    assert results == Counter(OK=20), results


def test_without_the_policy_they_fail_cancelled() -> None:
    """The same without the retry policy: what the rolling restart's client met (1 in ~300)."""
    results = _stop_with_calls_waiting([])
    assert results["CANCELLED"] > 0, results
