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
"""

from __future__ import annotations

import asyncio

from swactor.ring import Doorbell
from swactor.transport.driver import Driver
from swactor.transport.messages import WakeHint
from swactor.wire import RingReadable, RingWritable


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
