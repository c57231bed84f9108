"""Several connections to one address for Client and AsyncClient (`connections=N`): a server of
several processes on one port (SO_REUSEPORT) takes whole connections, so over one connection every
stream of a client lands on one process. Calls are dealt round-robin, past failing connections.
Every channel retries a call a stopping frontend cancelled before it began (RETRY_SERVICE_CONFIG).
"""

import itertools
import json
from collections.abc import Callable

import grpc

# connections whose calls fail at once (a frontend process that is restarting, or was not up yet)
FAILING = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


# A call that reached a frontend's gRPC core while its event loop was busy waits there until the
# loop takes it; when the frontend stops (a rolling restart), gRPC ends each such call CANCELLED,
# its handler never run and no response header sent. gRPC retries a call only while no header
# has come back, so retrying CANCELLED repeats no work that was started: the retry lands on a new
# connection, on a process that is not stopping. (A call the client cancels is never retried.)
RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "nanoserve.v1.FrontendService"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.02s",
                    "maxBackoff": "0.2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["CANCELLED"],
                },
            }
        ]
    }
)


def connection_options(
    options: list[tuple[str, int]], connections: int
) -> list[tuple[str, int | str]]:
    """The channel options of each of `connections` channels: the retry policy above, and (more
    than one) a subchannel pool of each channel's own: grpc core shares one connection among a
    process's channels to one address with identical args (its global subchannel pool)."""
    if connections < 1:
        raise ValueError(f"connections must be at least 1, got {connections}")
    retry: list[tuple[str, int | str]] = [("grpc.service_config", RETRY_SERVICE_CONFIG)]
    pool = [("grpc.use_local_subchannel_pool", 1)] if connections > 1 else []
    return [*options, *retry, *pool]


class RoundRobin:
    """Which of `n` connections the next call takes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._next = itertools.count()

    def pick(self, state: Callable[[int], grpc.ChannelConnectivity]) -> int:
        """The next connection in turn whose `state(k)` is not failing (a call there would end
        UNAVAILABLE while the others serve); when all are failing, the next in turn (its call says
        why)."""
        first = next(self._next)
        if self.n == 1:
            return 0
        for i in range(self.n):
            k = (first + i) % self.n
            if state(k) not in FAILING:
                return k
        return first % self.n
