"""Route the driver's wake hints to and from a worker process over eventfd doorbells.

Theory of operation
-------------------
A ring between the node and a worker process has two doorbells (spec §21, see
`swactor.ring.wake`): `readable` (rung by the ring's producer) and `writable` (rung by its
consumer). For an egress ring the worker produces and the driver's send-pump consumes:
the router waits on `readable` (an asyncio reader on the eventfd) and calls
`driver.ring_readable(ring_id)`, and it rings `writable` when the driver emits
`RingWritable`. An ingress ring is the mirror image. The pending bits in the ring header
decide whether a hint is sent at all; the router only carries them. It reads its own
doorbells only after the event loop reported them readable, so it never blocks and never
changes the fds' blocking mode (which the worker shares).

Build it before the driver (`Driver(..., wake=router.wake)`), then `bind(driver)`.

`WorkerWakeRoute` is the same wiring for a worker process's `WorkerDoorbells` (one set
for every ring of the worker, hints naming no ring): the node's path for every token.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from swactor.ring import Doorbell, WorkerDoorbells
from swactor.transport.driver import Driver
from swactor.transport.messages import WakeHint
from swactor.wire import RingReadable, RingWritable

log = logging.getLogger(__name__)


class DoorbellRouter:
    """Doorbell wiring for the rings of one driver."""

    def __init__(self) -> None:
        self._driver: Driver | None = None
        self._outbound: dict[tuple[int, type], Doorbell] = {}
        self._watched: dict[int, Doorbell] = {}

    def bind(self, driver: Driver) -> None:
        self._driver = driver

    def attach_egress(self, ring_id: int, readable: Doorbell, writable: Doorbell) -> None:
        """Worker produces, driver consumes (send side of an edge)."""
        self._outbound[(ring_id, RingWritable)] = writable
        self._watch(ring_id, readable, egress=True)

    def attach_ingress(self, ring_id: int, readable: Doorbell, writable: Doorbell) -> None:
        """Driver produces, worker consumes (receive side of an edge)."""
        self._outbound[(ring_id, RingReadable)] = readable
        self._watch(ring_id, writable, egress=False)

    def detach(self, ring_id: int) -> None:
        bell = self._watched.pop(ring_id, None)
        if bell is not None:
            asyncio.get_running_loop().remove_reader(bell.fileno())
        for key in [key for key in self._outbound if key[0] == ring_id]:
            del self._outbound[key]

    def wake(self, hint: WakeHint) -> None:
        """The driver's wake callback: ring the worker's doorbell for this hint."""
        bell = self._outbound.get((hint.ring_id, type(hint)))
        if bell is not None:
            bell.notify(hint.ring_id)

    def _watch(self, ring_id: int, bell: Doorbell, egress: bool) -> None:
        def ready() -> None:
            bell.wait(0)  # consume the count; readiness was just reported
            driver = self._driver
            if driver is None:
                return
            if egress:
                driver.ring_readable(ring_id)
            else:
                driver.ring_writable(ring_id)

        self._watched[ring_id] = bell
        asyncio.get_running_loop().add_reader(bell.fileno(), ready)


class WakeTarget(Protocol):
    """What a `WorkerWakeRoute` hints: the edge driver's wake entry points."""

    def ring_readable(self, ring_id: int) -> None: ...

    def ring_writable(self, ring_id: int) -> None: ...


class WorkerWakeRoute:
    """Wake hints between the edge driver and one worker process's `WorkerDoorbells`,
    on the event loop, with no actor between them.

    The node's hot path (spec §21 leaves the channel open): a token's object makes the
    driver's recv pump hint its ingress ring and the worker hint its egress ring once
    each, and a hint that went through GpuWorkerCtl's mailbox, its machine and the
    DriverActor's mailbox cost two actor hops and two table lookups per token for a
    decision nobody takes (a hint is only ever "look again"). Here:

    - `wake(hint)` (the driver's wake callback, through the node's `WorkerRingInstaller`)
      rings the worker's `to_worker` doorbell;
    - when the worker rings `readable` (`writable`), the loop calls
      `driver.ring_readable` (`ring_writable`) for every ring in `rings` (the rings the
      installer gave this worker); the driver ignores an id that is not one of its send
      (recv) rings, and the ring's pending bits keep a spurious look cheap.

    A hint outside a worker's life is harmless both ways: the worker of the next
    generation inherits the doorbells and takes a left-over count as a spurious look,
    and a count read while no driver is bound hints nobody. `bind(driver)` (on the
    running loop) starts reading the worker's doorbells; `close()` stops reading them
    and closes this process's fds.
    """

    def __init__(self, bells: WorkerDoorbells, rings: set[int]) -> None:
        self.bells = bells
        self.rings = rings
        self._driver: WakeTarget | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, driver: WakeTarget) -> None:
        self._driver = driver
        if self._loop is None:
            loop = self._loop = asyncio.get_running_loop()
            loop.add_reader(self.bells.readable.fd, self._rang, True)
            loop.add_reader(self.bells.writable.fd, self._rang, False)

    def wake(self, hint: WakeHint) -> None:
        self.bells.to_worker.notify()

    def _rang(self, egress: bool) -> None:
        bell = self.bells.readable if egress else self.bells.writable
        driver = self._driver
        if not bell.drain() or driver is None:
            return
        hint = driver.ring_readable if egress else driver.ring_writable
        for ring_id in tuple(self.rings):
            try:
                hint(ring_id)
            except Exception:  # the loop must keep serving the other rings' hints
                log.exception("wake hint for ring %d failed", ring_id)

    def close(self) -> None:
        loop, self._loop, self._driver = self._loop, None, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.bells.readable.fd)
            loop.remove_reader(self.bells.writable.fd)
        self.bells.close()
