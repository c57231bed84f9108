"""frontend.pacing.Pacer: how many ids a stream's next message waits for, from the event loop's
CPU share; and that a saturated loop makes Pending coalesce (fewer, fuller messages)."""

import asyncio
import time

from nanoserve.frontend.pacing import HIGH, LOW, Pacer
from nanoserve.frontend.workers.session import Pending


def test_observe_steps_up_to_max_and_back_with_a_dead_band() -> None:
    pacer = Pacer(max_ids=3)
    assert pacer.min_ids == 1
    for expected in (2, 3, 3):  # saturated: one more id a message per period, capped
        pacer.observe(HIGH + 0.1)
        assert pacer.min_ids == expected
    pacer.observe((HIGH + LOW) / 2)  # in the dead band: stays
    assert pacer.min_ids == 3
    pacer.observe(LOW - 0.1)
    pacer.observe(LOW - 0.1)
    pacer.observe(LOW - 0.1)
    assert pacer.min_ids == 1  # never below one


def test_max_ids_one_never_coalesces_nor_probes() -> None:
    async def main() -> None:
        pacer = Pacer(max_ids=1)
        pacer.start()
        assert pacer._task is None
        pacer.observe(1.0)
        assert pacer.min_ids == 1

    asyncio.run(main())


def test_the_probe_reads_the_loop_threads_cpu_share(monkeypatch) -> None:
    """The probe task: while the loop thread's CPU time advances with the wall clock (busy), min_ids
    rises; once it stops (idle), min_ids falls back to 1. The thread clock is faked: a loaded test
    machine must not decide the outcome."""
    from nanoserve.frontend import pacing

    busy = [True]
    cpu = [0.0]
    last = [time.monotonic()]

    def thread_time() -> float:
        now = time.monotonic()
        if busy[0]:
            cpu[0] += now - last[0]
        last[0] = now
        return cpu[0]

    monkeypatch.setattr(pacing.time, "thread_time", thread_time)

    async def main() -> tuple[int, int]:
        pacer = Pacer(max_ids=4, period_s=0.01)
        pacer.start()
        await asyncio.sleep(0.2)
        busy_ids = pacer.min_ids
        busy[0] = False
        await asyncio.sleep(0.2)
        idle_ids = pacer.min_ids
        await pacer.stop()
        return busy_ids, idle_ids

    busy_ids, idle_ids = asyncio.run(main())
    assert busy_ids > 1 and idle_ids == 1, (busy_ids, idle_ids)


def test_pending_with_min_ids_two_wakes_every_second_id() -> None:
    async def main() -> None:
        p = Pending()
        p.min_ids = 2
        p.ids[0].append(7)
        assert len(p.ids[0]) < p.min_ids  # the session reader would not wake it
        waiting = asyncio.ensure_future(p.take())
        await asyncio.sleep(0)
        assert not waiting.done()
        p.ids[0].append(8)
        p.wake()
        assert await waiting == [(0, [7, 8], None)]
        assert p.waiter is None and not p.woken

    asyncio.run(main())
