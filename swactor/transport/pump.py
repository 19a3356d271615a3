"""What a send pump and a receive pump share (spec §24): the skeleton of both bindings.

`SendEdge` (send_pump table) and `RecvEdge` (recv_pump table) each bind one edge's
machine. Around their different byte work they hold the same things: the edge id, the
ring id, the payload offset, the driver's event and wake sinks, the detail of the last
transport failure, and the `MachineHost` that feeds their machine and calls their effects. They
end the same way, in Closed or Faulted; both take the wire `StopEdge`; and the three
driver events their tables end with are sent the same way: `StreamClosed(edge, offset)`,
the table's `StreamFault(edge, reason)` (the failure's detail is logged here), and, once
the subclass has stopped its tasks, `PumpStopped(edge, ring)` before the ring goes.
"""

from __future__ import annotations

import enum
import logging
from typing import Generic, Protocol, TypeVar, cast

from swactor.fsm.host import MachineHost
from swactor.transport.messages import PumpStopped, StreamClosed
from swactor.transport.sinks import EmitEvent, EmitWake
from swactor.wire import EdgeId, StopEdge, StreamFault, StreamFaultReason

log = logging.getLogger("swactor.transport.pump")

E = TypeVar("E")


class NoGuards:
    """The guards of send_pump and recv_pump: neither table declares any."""


class _Stateful(Protocol):
    @property
    def state(self) -> enum.Enum: ...


class EdgePump(Generic[E]):
    """The shared skeleton (module doc); a subclass sets `machine` before `_start` and
    implements its table's Effects, which `host` calls."""

    machine: _Stateful
    terminal: frozenset[enum.Enum]
    """The table's end states (Closed, Faulted)."""

    def _start(self, edge_id: int, ring_id: int | None, host: MachineHost[E],
               emit: EmitEvent, wake: EmitWake) -> None:
        self.edge_id = edge_id
        self.ring_id = ring_id
        self.offset = 0
        self._emit = emit
        self._wake = wake
        self._detail = ""
        self._host = host

    @property
    def finished(self) -> bool:
        return self.machine.state in self.terminal

    def stop(self) -> None:
        """Teardown's StopEdge for this edge (spec §38)."""
        self.feed(cast(E, StopEdge(EdgeId(self.edge_id))))  # both tables take StopEdge

    def feed(self, event: E) -> None:
        """Apply `event`; effects may feed more events, which queue behind it."""
        self._host.feed(event)

    # -- the driver events both tables end with ----------------------------------------

    def _stream_closed(self) -> None:
        self._emit(StreamClosed(self.edge_id, self.offset))

    def _stream_fault(self, reason: StreamFaultReason) -> None:
        log.warning("edge %d: stream fault %s: %s", self.edge_id, reason.value, self._detail)
        self._emit(StreamFault(EdgeId(self.edge_id), reason))

    def _pump_stopped(self) -> None:
        """After the subclass stopped its tasks: report, then let the ring go."""
        self._emit(PumpStopped(self.edge_id, self.ring_id))
        self._release_ring()

    def _release_ring(self) -> None:
        raise NotImplementedError
