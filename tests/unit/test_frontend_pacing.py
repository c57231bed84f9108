"""frontend.pacing.Pacer: how many ids a stream's next message waits for, from the event loop's
CPU share; and that a saturated loop makes Pending coalesce (fewer, fuller messages)."""

import asyncio
import time

from nanoserve.frontend.pacing import HIGH, LOW, Pacer
from nanoserve.frontend.worker_session import Pending


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


def test_a_busy_loop_raises_min_ids_and_an_idle_one_lowers_it() -> None:
    async def main() -> None:
        pacer = Pacer(max_ids=4, period_s=0.01)
        pacer.start()
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # the loop thread busy, yielding between bursts
            t = time.monotonic()
            while time.monotonic() - t < 0.005:
                pass
            await asyncio.sleep(0)
        busy_ids = pacer.min_ids
        await asyncio.sleep(0.3)  # idle
        idle_ids = pacer.min_ids
        await pacer.stop()
        assert busy_ids > 1, busy_ids
        assert idle_ids == 1, idle_ids

    asyncio.run(main())


def test_pending_with_min_ids_two_wakes_every_second_id() -> None:
    async def main() -> None:
        p = Pending()
        p.min_ids = 2
        p.ids[0].append(7)
        assert len(p.ids[0]) < p.min_ids  # the session reader would not set the event
        p.ids[0].append(8)
        p.event.set()
        assert await p.take() == [(0, [7, 8], None)]

    asyncio.run(main())
