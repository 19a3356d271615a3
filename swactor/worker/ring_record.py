"""`RingRecord`: what the worker's ingress parser and egress producer share.

Theory of operation
-------------------
Both bindings (`IngressRing`, `EgressRing`) are built from one `InstallRing` command and
hold the same things: the command and its ObjectSpec, the arena the ring lives in, the
device bridge, the event sink to the node, and the ring handle.  The handle is opened by
`open_ring`, the step the worker takes before it feeds the machine its InstallRing (a
layout the helper refuses is logged with the helper's reason); the machines' shared
guard `layout_valid` only reads whether that worked, so a refused layout is a failed
install. `fault_reason` reads a Faulted shared state for either machine's `RingError`
event.  Each subclass adds its own machine,
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

    def open_ring(self) -> None:
        """Open the handle on the planned layout, before the machine is fed InstallRing;
        a layout the helper refuses leaves no handle (and is logged)."""
        if self.ring is not None:
            return
        try:
            self.ring = Ring.open(self._arena, self.command.layout)
        except RingError as exc:
            log.warning("ring %s: open refused: %s", int(self.command.ring_id), exc)

    def layout_valid(self, event: object) -> bool:
        """Guard of both machines' InstallRing: `open_ring` opened the handle."""
        return self.ring is not None

    @staticmethod
    def fault_reason(ring: Ring) -> RingFaultReason | None:
        """The reason of a Faulted shared ring state (RingStateInvalid when it names
        none), or None while the ring is not Faulted."""
        if ring.state is not RingState.Faulted:
            return None
        return ring.fault_reason or RingFaultReason.RingStateInvalid
