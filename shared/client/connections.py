"""Several connections to one address for Client and AsyncClient (`connections=N`): a server of
several processes on one port (SO_REUSEPORT) takes whole connections, so over one connection every
stream of a client lands on one process. Calls are dealt round-robin, past failing connections.
"""

import itertools
from collections.abc import Callable

import grpc

# connections whose calls fail at once (a frontend process that is restarting, or was not up yet)
FAILING = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


def connection_options(options: list[tuple[str, int]], connections: int) -> list[tuple[str, int]]:
    """The channel options of each of `connections` channels: grpc core shares one connection among
    a process's channels to one address with identical args (its global subchannel pool), so
    several channels each take a pool of their own."""
    if connections < 1:
        raise ValueError(f"connections must be at least 1, got {connections}")
    return [*options, ("grpc.use_local_subchannel_pool", 1)] if connections > 1 else list(options)


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
