"""WorkerWakeRoute: the worker's doorbells reach the driver, and the driver's the worker,
with no actor in between (swactor.transport.doorbells)."""

from __future__ import annotations

import asyncio

from swactor.edges import WorkerRingInstaller
from swactor.ring import WorkerDoorbells
from swactor.wire import RingId, RingReadable, RingWritable


class Driver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def ring_readable(self, ring_id: int) -> None:
        self.calls.append(("readable", ring_id))

    def ring_writable(self, ring_id: int) -> None:
        self.calls.append(("writable", ring_id))


class NoActor:
    """A GpuWorkerCtl ref that must not be mailed hints."""

    def tell(self, message: object) -> None:
        raise AssertionError(f"hint mailed to GpuWorkerCtl: {message!r}")


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_worker_doorbells_call_the_driver_for_each_ring_the_installer_gave() -> None:
    async def scenario() -> None:
        bells = WorkerDoorbells.create()
        installer = WorkerRingInstaller(NoActor(), {}, bells)  # type: ignore[arg-type]
        route = installer.route
        assert route is not None
        installer._rings.update({3, 4})
        driver = Driver()
        route.bind(driver)
        worker = bells  # the worker process rings the same eventfds (inherited)
        worker.readable.notify()
        worker.readable.notify()  # counted by the kernel: one look serves both
        await settle()
        assert sorted(driver.calls) == [("readable", 3), ("readable", 4)]
        driver.calls.clear()
        worker.writable.notify()
        await settle()
        assert sorted(driver.calls) == [("writable", 3), ("writable", 4)]
        driver.calls.clear()
        installer.forget(RingId(3))
        worker.readable.notify()
        await settle()
        assert driver.calls == [("readable", 4)]
        route.close()
        assert bells.readable.fd == -1

    asyncio.run(scenario())


def test_driver_hints_ring_the_worker_doorbell_only_for_its_rings() -> None:
    async def scenario() -> None:
        bells = WorkerDoorbells.create()
        installer = WorkerRingInstaller(NoActor(), {}, bells)  # type: ignore[arg-type]
        installer._rings.add(7)
        assert installer.wake(RingReadable(RingId(7)))
        assert installer.wake(RingWritable(RingId(7)))
        assert not installer.wake(RingReadable(RingId(8)))  # another installer's ring
        assert bells.to_worker.drain() == 2
        assert installer.route is not None
        installer.route.close()

    asyncio.run(scenario())
