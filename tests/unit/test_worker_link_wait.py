"""The worker link's bounded waits: `within` lets a cancellation that races the awaited result still
cancel (asyncio.wait_for before Python 3.12 swallowed it, and a frontend whose watcher lost close()'s
cancel never exited after SIGTERM); check_connected ends when a connection attempt fails."""

import asyncio
import socket
import time

import pytest

from nanoserve.errors import Unavailable
from nanoserve.frontend.workers.link import WorkerLink, within


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


def test_a_refused_connection_ends_check_connected_before_its_timeout() -> None:
    """Nothing listens at the address: the link says so once the attempt fails, not after the
    connect timeout (a call right after a worker stopped would otherwise wait it out)."""
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> float:
        link = WorkerLink(address, vet=lambda info: None, on_change=lambda link: None,
                          connect_timeout_s=20.0)  # fmt: skip
        start = time.monotonic()
        try:
            with pytest.raises(Unavailable, match="unreachable"):
                await link.check_connected()
        finally:
            await link.close()
        return time.monotonic() - start

    assert asyncio.run(main()) < 10.0
