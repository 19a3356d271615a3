"""The node's edge driver (spec §24-§25): edge demux, receive rendezvous, pump tasks.

Theory of operation
-------------------
The driver is the handler of the `swactor/edge/1` ALPN on the node's `QuicEndpoint`.

Receive side. A peer opens one uni-stream per edge and starts it with the 16-byte
`EdgePreamble`. The demux buffers a new stream's first bytes until the preamble is
complete, then:

* truncated (FIN inside the preamble) or garbage preamble -> `StreamFault(None, reason)`,
  the stream is stopped (STOP_SENDING); a bidirectional stream is refused the same way;
* an edge id that is neither provisioned (`expect_recv`) nor established -> `StreamFault(
  edge_id, UnknownEdge)`, stream stopped, no byte reaches a ring;
* a second stream for an edge that already has one -> `StreamFault(DuplicateStream)`;
* otherwise the stream is `StreamArrived`: if a receive spec exists (`recv_specs`), a
  `RecvPump` starts; if not, the stream waits in `pending_streams` — unread, so QUIC flow
  control stalls its sender — until `EstablishRecv` pairs it. Either order works, with
  no handshake between the edge ends.

`EstablishRecv` registers the spec, answers `DriverEdgeReady` at once (the pairing is now
guaranteed) and starts the pump if the stream is already pending.

Send side. `EstablishSend` starts a `SendPump`, which obtains the cached verified
connection to the consumer node (opening it if needed), reports `DriverEdgeReady`, and
opens its stream on the first bytes of the egress ring.

`StopEdge` cancels the edge's pump (a send pump resets its stream, a receive pump stops
its stream) and `PumpStopped` follows. Wake hints from the ring's other side arrive
through `ring_readable` / `ring_writable`; the driver turns them into the pump's events.
Connection loss fails every stream of that connection with `ConnectionLost`; a peer reset
fails its stream with `PeerReset`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from swactor.transport.config import EDGE_ALPN
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.errors import TransportError
from swactor.transport.messages import (
    DriverEdgeReady,
    DriverMessage,
    EstablishRecv,
    EstablishSend,
    StopEdge,
    StreamArrived,
    StreamFault,
)
from swactor.transport.pumps import (
    EmitEvent,
    EmitWake,
    InboundStream,
    RecvPump,
    SendPump,
    lost_reason,
)
from swactor.wire.enums import StreamFaultReason
from swactor.wire.errors import PreambleError
from swactor.wire.objects import PREAMBLE_LEN, EdgePreamble

StreamKey = tuple[QuicLink, int]


@dataclass(slots=True)
class _Preamble:
    """A new stream whose preamble is not complete yet."""

    head: bytearray


class Driver:
    """Edge driver bound to one endpoint (see the module docstring)."""

    def __init__(self, endpoint: QuicEndpoint, emit: EmitEvent, wake: EmitWake) -> None:
        self.endpoint = endpoint
        self.recv_specs: dict[int, EstablishRecv] = {}
        self.pending_streams: dict[int, InboundStream] = {}
        self.arrivals: list[StreamArrived] = []
        # Live and finished pumps by edge id (metrics and tests read their offsets).
        self.pumps: dict[int, RecvPump | SendPump] = {}
        self._emit = emit
        self._wake = wake
        self._expected: set[int] = set()
        self._heads: dict[StreamKey, _Preamble] = {}
        self._routed: dict[StreamKey, InboundStream] = {}
        self._refused: set[StreamKey] = set()
        self._edge_streams: dict[int, InboundStream] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._readable: dict[int, asyncio.Event] = {}
        self._writable: dict[int, asyncio.Event] = {}
        endpoint.register_handler(EDGE_ALPN, self)

    # -- inbound messages -------------------------------------------------------------

    def expect_recv(self, edge_ids: Iterable[int]) -> None:
        """Declare the active plan's inbound edge ids (streams for others are refused)."""
        self._expected.update(edge_ids)

    def handle(self, message: DriverMessage) -> None:
        if isinstance(message, EstablishRecv):
            self._establish_recv(message)
        elif isinstance(message, EstablishSend):
            self._establish_send(message)
        elif isinstance(message, StopEdge):
            self.stop_edge(message.edge_id)
        else:
            raise TransportError(f"driver: unknown message {type(message).__name__}")

    def _establish_recv(self, msg: EstablishRecv) -> None:
        if msg.edge_id in self.recv_specs or msg.edge_id in self._tasks:
            raise TransportError(f"edge {msg.edge_id} is already established")
        self._expected.add(msg.edge_id)
        self.recv_specs[msg.edge_id] = msg
        self._emit(DriverEdgeReady(msg.edge_id))
        inbound = self.pending_streams.pop(msg.edge_id, None)
        if inbound is not None:
            self._start_recv(msg, inbound)

    def _establish_send(self, msg: EstablishSend) -> None:
        if msg.edge_id in self._tasks:
            raise TransportError(f"edge {msg.edge_id} is already established")
        readable = self._readable.setdefault(msg.ring_id, asyncio.Event())
        pump = SendPump(
            self.endpoint,
            msg.edge_id,
            msg.rx_node_id,
            msg.ring_id,
            msg.ring,
            self._emit,
            self._wake,
            readable,
            self.endpoint.config.send_high_water,
        )
        self.pumps[msg.edge_id] = pump
        self._spawn(msg.edge_id, pump.run())

    def stop_edge(self, edge_id: int) -> None:
        """Cancel the edge's pump; its `PumpStopped` follows from the pump itself."""
        self.recv_specs.pop(edge_id, None)
        pending = self.pending_streams.pop(edge_id, None)
        if pending is not None:
            pending.link.stop_stream(pending.stream_id)
        inbound = self._edge_streams.get(edge_id)
        if inbound is not None:
            inbound.link.stop_stream(inbound.stream_id)
        task = self._tasks.get(edge_id)
        if task is not None:
            task.cancel()

    async def wait_stopped(self, edge_id: int) -> None:
        task = self._tasks.get(edge_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for edge_id in list(self._tasks):
            self.stop_edge(edge_id)
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- wake hints from the rings' other side ----------------------------------------

    def ring_readable(self, ring_id: int) -> None:
        self._readable.setdefault(ring_id, asyncio.Event()).set()

    def ring_writable(self, ring_id: int) -> None:
        self._writable.setdefault(ring_id, asyncio.Event()).set()

    # -- LinkHandler ----------------------------------------------------------------

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        key = (link, stream_id)
        routed = self._routed.get(key)
        if routed is not None:
            routed.feed(data, end)
            return
        if key in self._refused:
            link.consume(stream_id, len(data))  # discard; keep the connection credited
            return
        if not stream_id & 2:
            self._refuse(key, None, StreamFaultReason.PreambleGarbage, "bidirectional stream")
            return
        head = self._heads.setdefault(key, _Preamble(bytearray())).head
        head += data
        if len(head) < PREAMBLE_LEN:
            if end:
                del self._heads[key]
                self._refuse(
                    key,
                    None,
                    StreamFaultReason.PreambleTruncated,
                    f"stream ended after {len(head)} of {PREAMBLE_LEN} preamble bytes",
                )
            return
        del self._heads[key]
        try:
            edge_id = int(EdgePreamble.unpack(head).edge_id)
        except PreambleError as exc:
            self._refuse(key, None, exc.reason, str(exc))
            return
        link.consume(stream_id, PREAMBLE_LEN)
        if edge_id not in self._expected:
            self._refuse(key, edge_id, StreamFaultReason.UnknownEdge, "edge not in active plan")
            return
        if edge_id in self._edge_streams:
            self._refuse(key, edge_id, StreamFaultReason.DuplicateStream, "edge has a stream")
            return
        assert link.peer_node_id is not None
        self.arrivals.append(StreamArrived(edge_id, link.peer_node_id, stream_id))
        inbound = InboundStream(link, stream_id)
        inbound.feed(memoryview(head)[PREAMBLE_LEN:], end)
        self._routed[key] = inbound
        self._edge_streams[edge_id] = inbound
        spec = self.recv_specs.get(edge_id)
        if spec is None:
            self.pending_streams[edge_id] = inbound
        else:
            self._start_recv(spec, inbound)

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        key = (link, stream_id)
        self._heads.pop(key, None)
        inbound = self._routed.get(key)
        if inbound is not None:
            inbound.fail(StreamFaultReason.PeerReset, f"peer reset, code {error_code:#x}")

    def link_closed(self, link: QuicLink, reason: str) -> None:
        for key in [key for key in self._heads if key[0] is link]:
            del self._heads[key]
        for key, inbound in list(self._routed.items()):
            if key[0] is link:
                inbound.fail(lost_reason(reason), reason)
        self._refused = {key for key in self._refused if key[0] is not link}
        for pump in self.pumps.values():
            if isinstance(pump, SendPump) and pump.link is link:
                pump.wake()  # an idle send-pump notices the loss now, not on next bytes

    # -- internals ------------------------------------------------------------------

    def _refuse(
        self, key: StreamKey, edge_id: int | None, reason: StreamFaultReason, detail: str
    ) -> None:
        link, stream_id = key
        self._refused.add(key)
        link.stop_stream(stream_id)
        self._emit(StreamFault(edge_id, reason, detail))

    def _start_recv(self, spec: EstablishRecv, inbound: InboundStream) -> None:
        writable = self._writable.setdefault(spec.ring_id, asyncio.Event())
        pump = RecvPump(
            spec.edge_id, spec.ring_id, spec.ring, inbound, self._emit, self._wake, writable
        )
        self.pumps[spec.edge_id] = pump
        self._spawn(spec.edge_id, pump.run())

    def _spawn(self, edge_id: int, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task = asyncio.get_running_loop().create_task(coro, name=f"pump-edge-{edge_id}")
        self._tasks[edge_id] = task
