"""`python -m tests.e2e.refusing_worker MODEL_DIR`: a worker that has just begun to drain, as its
frontends have not heard yet. It answers GetModelInfo and GetLoad as an idle stand-in worker
(benchmarks.frontend_cost) but refuses every add UNAVAILABLE, printing `refused REQUEST_ID`."""

import asyncio
import sys

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nanoserve.benchmarks.frontend_cost import StandInWorker
from nanoserve.grpc_options import server_options
from nanoserve.process import WORKER_SERVICE
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc


class RefusingWorker(StandInWorker):
    async def Session(self, request_iterator, context):
        async for message in request_iterator:
            if not message.adds:
                continue
            response = worker_pb2.SessionResponse()
            for add in message.adds:
                print(f"refused {add.request.request_id}", flush=True)
                response.outputs.add(
                    request_id=add.request.request_id,
                    error_code=grpc.StatusCode.UNAVAILABLE.value[0],
                    error_message="the worker is shutting down",
                )
            yield response


async def main(model_dir: str) -> None:
    server = grpc.aio.server(options=server_options())
    worker_grpc.add_WorkerServiceServicer_to_server(RefusingWorker(model_dir, 0.005), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", WORKER_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"worker listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
