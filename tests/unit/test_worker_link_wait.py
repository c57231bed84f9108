"""worker_link.within, the bounded wait of the link's watcher: a cancellation that races the awaited
result still cancels (asyncio.wait_for before Python 3.12 swallowed it, and a frontend whose watcher
lost close()'s cancel never exited after SIGTERM)."""

import asyncio

import pytest

from nanoserve.frontend.worker_link import within


async def race(wait) -> bool:
    """Whether one cancel ends a task that waits on a future through `wait`, when the cancel comes
    in the same loop pass as the future's result: the race a watcher lost when close() cancelled
    it."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    async def waiter() -> None:
        first = True
        while True:  # the watcher's loop: only a cancellation ends it
            await wait(future if first else loop.create_future())  # later ones never resolve
            first = False

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the task now waits on the future
    future.set_result(None)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    if not done:  # the cancel was lost: the waiter went on to a future that never resolves
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return bool(done) and task.cancelled()


def test_a_cancel_racing_the_result_ends_the_waiter() -> None:
    assert asyncio.run(race(lambda f: within(f, 10.0)))


def test_within_reports_a_timeout_and_reraises_an_error() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        never = loop.create_future()
        assert await within(never, 0.01) is False
        assert never.cancelled()  # nothing left waiting behind the timeout
        done = loop.create_future()
        done.set_result(1)
        assert await within(done, 1.0) is True
        failed = loop.create_future()
        failed.set_exception(ConnectionError("gone"))
        with pytest.raises(ConnectionError, match="gone"):
            await within(failed, 1.0)

    asyncio.run(main())
