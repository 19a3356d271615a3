"""`RecvEdge`: the receive half of one edge, bound to the generated `recv_pump` machine.

Theory of operation
-------------------
The machine (`fsm/recv_pump.yaml`, spec §25) decides; this binding observes and carries
out effects. It feeds the machine:

* `EstablishRecv` (the driver got the local receive spec and opened the ring) and
  `StreamArrived` (the demux read a preamble naming this edge) — in either order; the
  machine answers `StartPump` once both halves are here;
* from the pump loop: `RingFull` (no writable span), `RingWritable` (the binding's own
  re-check found space after clearing the pending bit), `StreamEof` (FIN and every byte
  committed), `RingFault` (the ring is Faulted or refused an advance);
* from the driver: `RingWritable` wake hints, `PeerStopped` (the sender reset with the
  "stopped" code: its graceful stop), `StreamError` (any other peer reset, connection
  lost, idle timeout) and `StopEdge`.

Effects: `DriverEdgeReady`, `StreamClosed`, `StreamFault`, `PumpStopped` become driver
events; `StartPump` starts the pump task; `ResumeReading` wakes it; `StopReading` (graceful
StopEdge) sends STOP_SENDING with the "stopped" code, `AbortReading` (a fault) with the
abort code, and each cancels it; `CloseRingProducer` closes the ring's producer side (EOF for
the worker's parser). After `PumpStopped` the task never touches the ring again; the
ring handle is closed once the task has finished.

The pump loop (hot path, byte-blind): copy buffered stream bytes into the ring's writable
span, `commit_and_mark` (one native call; send `RingReadable` only when the pending bit
was clear), credit QUIC with exactly the bytes copied. Ring full: clear the wake event,
feed `RingFull`, clear the writable pending bit, re-check, then sleep until a wake.
Ring spans live only inside one synchronous copy and are released on every way out of
it: a sleeping or cancelled pump never pins the arena mapping.
"""

from __future__ import annotations

import asyncio

from swactor.fsm.generated import recv_pump as fsm
from swactor.fsm.host import MachineHost
from swactor.ring import Ring, RingError, RingState
from swactor.transport.endpoint import ABORTED_CODE, STOPPED_CODE
from swactor.transport.inbound import InboundStream
from swactor.transport.messages import (
    DriverEdgeReady,
)
from swactor.transport.pump import EdgePump, NoGuards
from swactor.transport.sinks import EmitEvent, EmitWake
from swactor.wire import (
    EdgeId,
    RingFaultReason,
    RingId,
    RingLayout,
    RingReadable,
    StreamFaultReason,
)

_TERMINAL = frozenset({fsm.State.Closed, fsm.State.Faulted})


class RecvEdge(EdgePump[fsm.Event], fsm.RecvPumpEffects[None]):
    """One edge's receive side: machine, ring handle, inbound stream, pump task; the
    recv_pump effects."""

    terminal = _TERMINAL

    def __init__(self, edge_id: int, emit: EmitEvent, wake: EmitWake) -> None:
        self.machine = fsm.RecvPumpMachine(NoGuards(), edge_id=EdgeId(edge_id), ring_id=None)
        self._start(edge_id, None, MachineHost(self.machine, fsm.bind(self)), emit, wake)
        self.ring: Ring | None = None
        self.inbound: InboundStream | None = None
        self.task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()

    # -- events in ------------------------------------------------------------------

    def establish(self, ring_id: int, layout: RingLayout, ring: Ring) -> None:
        self.ring, self.ring_id = ring, ring_id
        self.feed(fsm.EstablishRecv(EdgeId(self.edge_id), RingId(ring_id), layout))

    def stream_arrived(self, inbound: InboundStream) -> None:
        if self.inbound is None:
            self.inbound = inbound
        else:
            inbound.stop()  # the duplicate itself is never read
            self._detail = f"second stream {inbound.stream_id} for the edge"
        self.feed(fsm.StreamArrived(EdgeId(self.edge_id)))

    def ring_writable(self) -> None:
        if self.ring_id is not None:
            self.feed(fsm.RingWritable(RingId(self.ring_id)))

    def stream_failed(self, reason: StreamFaultReason, detail: str) -> None:
        self._detail = detail
        self.feed(fsm.StreamError(reason))

    def peer_stopped(self) -> None:
        """The sender ended the stream with the "stopped" code (its graceful StopEdge)."""
        self.feed(fsm.PeerStopped())

    # -- effects (RecvPumpEffects) ----------------------------------------------------

    def driver_edge_ready(self, edge_id: EdgeId) -> None:
        self._emit(DriverEdgeReady(edge_id))

    def start_pump(self, edge_id: EdgeId) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"recv-pump-{self.edge_id}"
        )

    def resume_reading(self, edge_id: EdgeId) -> None:
        self._writable.set()

    def stop_reading(self, edge_id: EdgeId) -> None:
        if self.inbound is not None:
            self.inbound.stop(STOPPED_CODE)
        self._cancel_task()

    def abort_reading(self, edge_id: EdgeId) -> None:
        if self.inbound is not None:
            self.inbound.stop(ABORTED_CODE)
        self._cancel_task()

    def close_ring_producer(self, edge_id: EdgeId) -> None:
        assert self.ring is not None and self.ring_id is not None
        self.ring.close_producer()
        if self.ring.mark_readable_pending():
            self._wake(RingReadable(RingId(self.ring_id)))

    def stream_closed(self, edge_id: EdgeId) -> None:
        self._stream_closed()

    def stream_fault(self, edge_id: EdgeId, reason: StreamFaultReason) -> None:
        self._stream_fault(reason)

    def pump_stopped(self, edge_id: EdgeId, ring_id: RingId | None) -> None:
        self._cancel_task()
        self._pump_stopped()

    def _cancel_task(self) -> None:
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _release_ring(self) -> None:
        ring, task = self.ring, self.task
        if ring is None:
            return
        if task is None or task.done() or task is asyncio.current_task():
            ring.close()
        else:
            task.add_done_callback(lambda _: ring.close())

    # -- the pump (hot path) ----------------------------------------------------------

    async def _pump(self) -> None:
        ring, inbound, ring_id = self.ring, self.inbound, self.ring_id
        assert ring is not None and inbound is not None and ring_id is not None
        link, stream_id, writable = inbound.link, inbound.stream_id, self._writable
        try:
            while self.machine.state is fsm.State.Streaming:
                if inbound.buffered:
                    moved = _fill_span(ring, inbound)
                    if not moved:
                        if ring.state is not RingState.Open:
                            self._ring_fault(ring)
                            return
                        writable.clear()
                        self.feed(fsm.RingFull())
                        ring.clear_writable_pending()
                        if _writable_bytes(ring):
                            self.feed(fsm.RingWritable(RingId(ring_id)))
                        await writable.wait()
                        continue
                    if ring.commit_and_mark(moved):
                        self._wake(RingReadable(RingId(ring_id)))
                    self.offset += moved
                    link.consume(stream_id, moved)
                elif inbound.eof:
                    self.feed(fsm.StreamEof())
                else:
                    inbound.changed.clear()
                    await inbound.changed.wait()
        except RingError as exc:
            self._detail = str(exc)
            self.feed(fsm.RingFault(RingId(ring_id), exc.reason))

    def _ring_fault(self, ring: Ring) -> None:
        reason = ring.fault_reason or RingFaultReason.RingStateInvalid
        self._detail = f"ring {self.ring_id} is {ring.state.name}"
        self.feed(fsm.RingFault(RingId(self.ring_id or 0), reason))


def _fill_span(ring: Ring, inbound: InboundStream) -> int:
    """Copy buffered stream bytes into the ring's writable span: the count (0: full).

    The span is released on every way out (`with`), so a pump that sleeps on a full ring,
    or is cancelled there, never pins the arena mapping (`Arena.close` would raise
    ArenaBusyError)."""
    with ring.writable_span() as span:
        return inbound.read_into(span) if len(span) else 0


def _writable_bytes(ring: Ring) -> int:
    """How many bytes the ring's writable span holds now (the view is released)."""
    with ring.writable_span() as span:
        return len(span)
