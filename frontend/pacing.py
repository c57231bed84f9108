"""Stream pacing: how many new ids a stream's next message waits for (RequestRunner.stream sets
Pending.min_ids from it). When this process's event loop nears a full core, each message waits for
more ids, so the frontend pays its per-message cost (the handler's wake-up, the gRPC send and its
sendmsg) once per several tokens exactly when it is short of CPU, instead of falling behind the
engine; when the loop has room again, messages go back to one per engine step.
"""

import asyncio
import time

# The loop thread's CPU share over a probe period: above HIGH it is near saturation (the next burst
# of wake-ups will queue behind this one), below LOW it has room for one more message per stream.
HIGH, LOW = 0.9, 0.6


class Pacer:
    """`min_ids`: 1 while the loop has room; up to `max_ids` while it is near a full core."""

    def __init__(self, max_ids: int, period_s: float = 0.02) -> None:
        self.max_ids = max(1, max_ids)
        self.period_s = period_s
        self.min_ids = 1
        self._task: asyncio.Task | None = None

    def observe(self, busy: float) -> None:
        """One probe period's share of a core spent by the loop thread -> min_ids (one step at a
        time, with a dead band between LOW and HIGH so that it settles instead of oscillating)."""
        if busy > HIGH and self.min_ids < self.max_ids:
            self.min_ids += 1
        elif busy < LOW and self.min_ids > 1:
            self.min_ids -= 1

    def start(self) -> None:
        """Starts probing on the running loop (once; a no-op when max_ids is 1)."""
        if self._task is None and self.max_ids > 1:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="pacer")

    async def _probe(self) -> None:
        # thread_time: this (the loop's) thread's CPU, not gRPC's poller or the tokenizer threads
        wall, cpu = time.monotonic(), time.thread_time()
        while True:
            await asyncio.sleep(self.period_s)
            now, now_cpu = time.monotonic(), time.thread_time()
            self.observe((now_cpu - cpu) / max(now - wall, 1e-6))
            wall, cpu = now, now_cpu

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
