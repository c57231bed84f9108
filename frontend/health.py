"""The frontend's gRPC health service: grpc_health's, except that with `ends_watches` (frontends
sharing a port) a Watch stream ends once it has said NOT_SERVING for a stop. An open stream would
hold gRPC's graceful stop for the whole grace period; a watcher whose stream ends watches again on
a new connection, which a port-sharing process takes."""

import asyncio

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio


class HealthServicer(health_aio.HealthServicer):
    """Statuses are health_pb2.HealthCheckResponse.ServingStatus values."""

    def __init__(self, ends_watches: bool) -> None:
        super().__init__()
        self.ends_watches = ends_watches
        self.stopping = False
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._changed = asyncio.Condition()

    async def set(self, service: str, status: int) -> None:
        if not self.stopping:
            self._statuses[service] = status
        await super().set(service, status)
        await self._notify()

    async def enter_graceful_shutdown(self) -> None:
        self.stopping = True
        await super().enter_graceful_shutdown()
        await self._notify()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        if not self.ends_watches:
            return await super().Watch(request, context)
        last = None
        while True:
            status = self._status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self.stopping:
                return  # NOT_SERVING said (or SERVICE_UNKNOWN): the stream ends OK
            async with self._changed:
                if self._status(request.service) == last and not self.stopping:
                    await self._changed.wait()

    def _status(self, service: str) -> int:
        if service not in self._statuses:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        if self.stopping:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return self._statuses[service]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
