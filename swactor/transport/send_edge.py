"""`SendEdge`: the send half of one edge, bound to the generated `send_pump` machine.

Theory of operation
-------------------
The machine (`fsm/send_pump.yaml`, spec §25) decides; this binding observes and carries
out effects:

* `EnsureConnection` -> a task obtains the verified cached `swactor/edge/1` link to the
  consumer node and feeds `ConnectionReady` (or `TransportFailed(reason)`);
* `CheckRing` -> look at the egress ring: bytes -> feed `RingReadable`; producer closed and
  empty -> `ProducerClosed`; else clear the readable pending bit, re-check, and otherwise
  wait for a wake hint (the driver feeds it);
* `OpenUniStream` -> open the edge's one uni-stream, write the 16-byte `EdgePreamble`,
  feed `StreamOpened`;
* `DrainRing` -> wake the drain task; `FinishStream` -> FIN; `ResetStream` -> RESET with the abort
  code (a fault for the receiver); `StopStream` -> RESET with the stopped code (a graceful
  stop: the receiver closes the edge without a fault);
* `DriverEdgeReady`, `StreamClosed`, `StreamFault`, `PumpStopped` -> driver events.

The driver reports the receiver's STOP_SENDING through `peer_stopped`: the "stopped" code
(the receiver's graceful StopEdge came first) feeds `PeerStopped`, a clean close; any
other code (a refusal or a receiver fault) is `TransportFailed(PeerReset)`.

Drain task (hot path, byte-blind): write at most (high-water - unacknowledged bytes) of
the readable span to the stream, `consume_and_mark` (send `RingWritable` only when the
pending bit was clear). At the high-water mark it feeds `WriteBlocked`, waits for link
progress (ACKs), feeds `WriteProgress`. An empty ring: producer closed -> feed
`ProducerClosed`; otherwise clear the pending bit, re-check, sleep until `DrainRing`.
A closed link feeds `TransportFailed` with `ConnectionLost` or `IdleTimeout`.
Ring views (spans) live only inside one synchronous drain step and are released on every
way out of it, before any event is fed: a drain task that sleeps, is cancelled by
`PumpStopped` or ends on a lost connection never pins the arena mapping.

A wake hint in `WaitingForBytes` is observed through the `CheckRing` logic (so a
producer that closes without writing yields `ProducerClosed`, no stream); in `Streaming`
it is fed as `RingReadable` (-> `DrainRing`).
"""

from __future__ import annotations

import asyncio
import enum

from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import send_pump as fsm
from swactor.fsm.host import MachineHost
from swactor.ring import Ring, RingError, RingState
from swactor.transport.config import EDGE_ALPN
from swactor.transport.endpoint import ABORTED_CODE, STOPPED_CODE, QuicEndpoint, QuicLink
from swactor.transport.errors import ConnectionLostError, PeerRejectedError, TransportError
from swactor.transport.inbound import lost_reason
from swactor.transport.messages import (
    DriverEdgeReady,
)
from swactor.transport.pump import EdgePump, NoGuards
from swactor.transport.sinks import EmitEvent, EmitWake
from swactor.wire import (
    EdgeId,
    EdgePreamble,
    NodeId,
    RingFaultReason,
    RingId,
    RingWritable,
    StreamFaultReason,
)

_TERMINAL = frozenset({fsm.State.Closed, fsm.State.Faulted})


class _Step(enum.Enum):
    """What one `SendEdge._drain_step` did, for the drain loop to act on."""

    Moved = enum.auto()  # bytes moved, or more may be readable: loop again
    Idle = enum.auto()  # ring empty and open: sleep until DrainRing
    Blocked = enum.auto()  # at the high-water mark: wait for link progress
    Ended = enum.auto()  # a fault was fed: the task ends


class SendEdge(EdgePump[fsm.Event], fsm.SendPumpEffects[None]):
    """One edge's send side: machine, ring handle, link, stream, drain task; the send_pump
    effects."""

    terminal = _TERMINAL
    ring_id: int

    def __init__(
        self,
        endpoint: QuicEndpoint,
        edge_id: int,
        rx_node_id: int,
        ring_id: int,
        ring: Ring,
        emit: EmitEvent,
        wake: EmitWake,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.machine = fsm.SendPumpMachine(
            NoGuards(), edge_id=EdgeId(edge_id), ring_id=RingId(ring_id)
        )
        self._start(edge_id, ring_id, MachineHost(self.machine, fsm.bind(self)), emit, wake)
        self.endpoint = endpoint
        self.faults = faults
        self.rx_node_id = rx_node_id
        self.ring = ring
        self.link: QuicLink | None = None
        self.stream_id: int | None = None
        self._high_water = endpoint.config.send_high_water
        self._kick = asyncio.Event()
        self._draining = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return self._tasks

    # -- events in ------------------------------------------------------------------

    def start(self) -> None:
        self.feed(
            fsm.EstablishSend(EdgeId(self.edge_id), NodeId(self.rx_node_id), RingId(self.ring_id))
        )

    def ring_readable(self) -> None:
        state = self.machine.state
        if state is fsm.State.WaitingForBytes:
            self._check_ring()
        elif state is fsm.State.Streaming:
            self.feed(fsm.RingReadable(RingId(self.ring_id)))

    def link_lost(self, detail: str) -> None:
        self._fail(lost_reason(detail), detail)

    def peer_stopped(self, error_code: int) -> None:
        """The receiver sent STOP_SENDING: with the "stopped" code its graceful stop (a
        clean close), with any other code a fault."""
        if self.finished:
            return  # already ended (FIN sent, or our own stop): nothing left to stop
        if error_code == STOPPED_CODE:
            self.feed(fsm.PeerStopped())
        else:
            self._fail(StreamFaultReason.PeerReset,
                       f"peer stopped the stream, code {error_code:#x}")

    def _fail(self, reason: StreamFaultReason, detail: str) -> None:
        self._detail = detail
        self.feed(fsm.TransportFailed(reason))

    # -- effects (SendPumpEffects) ----------------------------------------------------

    def ensure_connection(self, edge_id: EdgeId, rx_node_id: NodeId) -> None:
        self._spawn(self._connect(), "connect")

    def driver_edge_ready(self, edge_id: EdgeId) -> None:
        self._emit(DriverEdgeReady(edge_id))

    def check_ring(self, ring_id: RingId) -> None:
        self._check_ring()

    def open_uni_stream(self, edge_id: EdgeId) -> None:
        self._open_stream()

    def drain_ring(self, ring_id: RingId) -> None:
        self._kick.set()
        if not self._draining:
            self._draining = True
            self._spawn(self._drain(), "drain")

    def finish_stream(self, edge_id: EdgeId) -> None:
        if self.link is not None and self.stream_id is not None:
            self.link.send(self.stream_id, b"", end=True)

    def reset_stream(self, edge_id: EdgeId) -> None:
        if self.link is not None and self.stream_id is not None:
            self.link.reset_stream(self.stream_id, ABORTED_CODE)

    def stop_stream(self, edge_id: EdgeId) -> None:
        if self.link is not None and self.stream_id is not None:
            self.link.reset_stream(self.stream_id, STOPPED_CODE)

    def stream_closed(self, edge_id: EdgeId) -> None:
        self._stream_closed()

    def stream_fault(self, edge_id: EdgeId, reason: StreamFaultReason) -> None:
        self._stream_fault(reason)

    def pump_stopped(self, edge_id: EdgeId, ring_id: RingId) -> None:
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._pump_stopped()

    def _spawn(self, coro: object, what: str) -> None:
        assert asyncio.iscoroutine(coro)
        task = asyncio.get_running_loop().create_task(coro, name=f"send-{what}-{self.edge_id}")
        self._tasks.append(task)

    def _release_ring(self) -> None:
        ring = self.ring
        pending = [t for t in self._tasks if not t.done() and t is not asyncio.current_task()]
        if not pending:
            ring.close()
            return
        remaining = len(pending)

        def one_done(_: object) -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0:
                ring.close()

        for task in pending:
            task.add_done_callback(one_done)

    def _check_ring(self) -> None:
        ring = self.ring
        try:
            if _readable_bytes(ring):
                self.feed(fsm.RingReadable(RingId(self.ring_id)))
                return
            ring.clear_readable_pending()
            if _readable_bytes(ring):
                self.feed(fsm.RingReadable(RingId(self.ring_id)))
            elif ring.state is RingState.Closed:
                self.feed(fsm.ProducerClosed())
            elif ring.state is RingState.Faulted:
                self._ring_fault()
        except RingError as exc:
            self._detail = str(exc)
            self.feed(fsm.RingFault(RingId(self.ring_id), exc.reason))

    def _ring_fault(self) -> None:
        reason = self.ring.fault_reason or RingFaultReason.RingStateInvalid
        self._detail = f"ring {self.ring_id} faulted"
        self.feed(fsm.RingFault(RingId(self.ring_id), reason))

    def _open_stream(self) -> None:
        assert self.link is not None
        link = self.link = self.endpoint.shared_link(self.link)
        try:
            stream_id = link.open_uni_stream()
            link.send(stream_id, EdgePreamble(edge_id=EdgeId(self.edge_id)).pack())
        except ConnectionLostError as exc:
            self._fail(lost_reason(str(exc)), str(exc))
            return
        self.stream_id = stream_id
        self.feed(fsm.StreamOpened())

    # -- tasks ----------------------------------------------------------------------

    async def _connect(self) -> None:
        if self.faults.connect_fails(int(self.edge_id)):
            self._fail(StreamFaultReason.HandshakeFailed, "injected handshake failure")
            return
        try:
            self.link = await self.endpoint.connect(self.rx_node_id, EDGE_ALPN)
        except PeerRejectedError as exc:
            self._fail(StreamFaultReason.PeerNotAllowed, str(exc))
        except ConnectionLostError as exc:
            self._fail(StreamFaultReason.HandshakeFailed, str(exc))
        except (TransportError, OSError) as exc:
            self._fail(StreamFaultReason.ConnectionLost, str(exc))
        else:
            self.feed(fsm.ConnectionReady())

    async def _drain(self) -> None:
        link, kick, ring_id = self.link, self._kick, self.ring_id
        assert link is not None and self.stream_id is not None
        try:
            while not self.finished:
                await kick.wait()
                kick.clear()
                while self.machine.state is fsm.State.Streaming:
                    if link.closed:
                        self.link_lost(link.close_reason)
                        return
                    step = self._drain_step(link)
                    if step is _Step.Moved:
                        continue
                    if step is _Step.Idle:
                        break  # sleep until DrainRing
                    if step is _Step.Ended:
                        return
                    # _Step.Blocked: wait for ACKs to drain the stream's send buffer
                    self.feed(fsm.WriteBlocked())
                    link.progress.clear()
                    await link.progress.wait()
                    if link.closed:
                        self.link_lost(link.close_reason)
                        return
                    self.feed(fsm.WriteProgress())
        except RingError as exc:
            self._detail = str(exc)
            self.feed(fsm.RingFault(RingId(ring_id), exc.reason))
        except ConnectionLostError as exc:
            self.link_lost(str(exc))

    def _drain_step(self, link: QuicLink) -> _Step:
        """One pass of the drain loop, without awaiting: move readable bytes to the
        stream, or observe why none moved.  Events that may stop the pump are fed only
        after `_send_span` has released its views."""
        ring = self.ring
        if self.faults.pump_fails(int(self.edge_id)):
            raise RingError("injected pump failure", self.ring_id)
        try:
            moved = self._send_span(link)
        except RuntimeError as exc:
            # aioquic refuses writes to a stream the peer stopped.
            self._fail(StreamFaultReason.PeerReset, str(exc))
            return _Step.Ended
        if moved is None:
            return _Step.Blocked
        if moved:
            self.offset += moved
            if ring.consume_and_mark(moved):
                self._wake(RingWritable(RingId(self.ring_id)))
            return _Step.Moved
        state = ring.state
        if state is RingState.Open:
            ring.clear_readable_pending()
            return _Step.Moved if _readable_bytes(ring) else _Step.Idle
        if state is RingState.Closed:
            if not _readable_bytes(ring):
                self.feed(fsm.ProducerClosed())
            return _Step.Moved
        self._ring_fault()
        return _Step.Ended

    def _send_span(self, link: QuicLink) -> int | None:
        """Write the ring's readable span, up to the high-water room, to the stream:
        the bytes written (0: the ring is empty; None: no room below high water).

        The ring views live only inside this call and are released on every way out of
        it (`with`, exceptions included), so no suspended, cancelled or failed drain
        task, nor an exception's traceback, can pin the arena mapping (`Arena.close`
        would raise ArenaBusyError)."""
        stream_id = self.stream_id
        assert stream_id is not None
        with self.ring.readable_span() as span:
            if not len(span):
                return 0
            room = self._high_water - link.quic.send_buffered(stream_id)
            if room <= 0:
                return None
            moved = min(len(span), room)
            with span[:moved] as chunk:
                # fault port (driver.send): FIN mid-object or reset
                cut = self.faults.stream_cut(int(self.edge_id), self.offset, moved)
                if cut == "hold":
                    return None  # after the injected FIN: write nothing more
                if cut == "fin":
                    link.send(stream_id, chunk[: moved // 2], end=True)
                else:
                    link.send(stream_id, chunk)
                if cut == "reset":
                    link.reset_stream(stream_id, ABORTED_CODE)
            return moved


def _readable_bytes(ring: Ring) -> int:
    """How many bytes the ring's readable span holds now (the view is released)."""
    with ring.readable_span() as span:
        return len(span)
