"""`RingRecord`: what the worker's ingress parser and egress producer share.

Theory of operation
-------------------
Both bindings (`IngressRing`, `EgressRing`) are built from one `InstallRing` command and
hold the same things: the command and its ObjectSpec, the arena the ring lives in, the
device bridge, the event sink to the node, and the ring handle.  The handle is opened by
the machines' shared guard `layout_valid` (a layout the helper refuses is a failed
install, logged with the helper's reason), and `fault_reason` reads a Faulted shared
state for either machine's `RingError` event.  Each subclass adds its own machine,
feeder and byte work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from swactor.arena import Arena
from swactor.faults import NO_FAULTS, Faults
from swactor.ring import Ring, RingError, RingState
from swactor.wire import InstallRing, RingFaultReason, WorkerEvent
from swactor.worker.bridge import DeviceBridge

log = logging.getLogger(__name__)


class RingRecord:
    """One installed ring of the worker: command, arena, bridge, event sink, handle."""

    def __init__(
        self,
        command: InstallRing,
        arena: Arena,
        bridge: DeviceBridge,
        emit: Callable[[WorkerEvent], None],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.command = command
        self.faults = faults
        self.spec = command.object_spec
        self._arena = arena
        self._bridge = bridge
        self._emit = emit
        self.ring: Ring | None = None

    def layout_valid(self, event: object) -> bool:
        """Guard of both machines' InstallRing: open the handle on the planned layout."""
        try:
            self.ring = Ring.open(self._arena, self.command.layout)
        except RingError as exc:
            log.warning("ring %s: open refused: %s", int(self.command.ring_id), exc)
            return False
        return True

    @staticmethod
    def fault_reason(ring: Ring) -> RingFaultReason | None:
        """The reason of a Faulted shared ring state (RingStateInvalid when it names
        none), or None while the ring is not Faulted."""
        if ring.state is not RingState.Faulted:
            return None
        return ring.fault_reason or RingFaultReason.RingStateInvalid
