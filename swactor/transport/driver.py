"""The node's edge driver (spec §24-§25): edge demux, receive rendezvous, pump bindings.

Theory of operation
-------------------
The driver is the `swactor/edge/1` handler of the node's `QuicEndpoint` and owns one
binding per edge: `RecvEdge` (generated `recv_pump` machine) or `SendEdge` (generated
`send_pump` machine). It opens its own `Ring` handle on the node's arena from the
`RingLayout` each establish message carries.

Receive side. A peer opens one uni-stream per edge and starts it with the 16-byte
`EdgePreamble`. The demux buffers a new stream's first bytes until the preamble is
complete, then:

* FIN inside the preamble, or a garbage preamble -> `StreamRefused(None, reason)` and
  STOP_SENDING; a bidirectional stream is refused the same way (`PreambleGarbage`);
* an edge id that the active plan does not name (neither `expect_recv` nor
  `EstablishRecv`) -> `StreamRefused(edge_id, UnknownEdge)`, stream stopped; a stream for
  an edge that already finished -> `StreamRefused(edge_id, DuplicateStream)`;
* a stream from a peer that is not the edge's producer (each expected edge is bound to
  the node id its plan names, spec §4) -> `StreamRefused(None, PeerNotAllowed)` naming
  the edge and both nodes, stream stopped; the edge is not touched, so its real
  producer's stream, before or after, is served as if nothing happened;
* otherwise `StreamArrived` goes to the edge's machine. Whether the receive spec is
  already there (`recv_specs`) or comes later (`pending_streams`: unread, so QUIC flow
  control stalls the sender) the machine starts the pump when it has both halves. A
  second stream for a live edge faults the edge (table choice, DuplicateStream).

Send side. `EstablishSend` creates a `SendEdge`, which connects (connection cache of the
endpoint), reports `DriverEdgeReady`, and opens its stream on the first egress bytes.

Wake hints from the rings' other side arrive through `ring_readable` / `ring_writable`
and are routed by ring id. A peer reset with the "stopped" code (the sender's graceful
stop) becomes the receiver's `PeerStopped`, and STOP_SENDING with that code (the
receiver's graceful stop) the sender's `PeerStopped`: clean closes. Other peer resets,
STOP_SENDING codes and connection loss become `StreamError` / `TransportFailed` of the
affected edges; a stream the driver refuses is stopped with the abort code. `StopEdge`
for an edge with no binding is answered `PumpStopped(edge_id, None)` directly.

Edges of past runs. Edge ids are drawn per run, so a long-lived node would keep every
finished binding (with its link, ring handle and ended pump task) forever. When a new
plan arrives (`expect_recv`, or an establish message) the driver forgets the bindings
whose pumps have ended, keeping only their ids (the last `ENDED_IDS_KEPT`), so a late
stream for one is still refused as `DuplicateStream`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable

from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated.recv_pump import State
from swactor.ring import Ring, RingError
from swactor.ring.ring import ArenaLike
from swactor.transport.config import EDGE_ALPN
from swactor.transport.endpoint import ABORTED_CODE, STOPPED_CODE, QuicEndpoint, QuicLink
from swactor.transport.errors import TransportError
from swactor.transport.inbound import InboundStream, lost_reason
from swactor.transport.messages import (
    DriverMessage,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamArrived,
    StreamFault,
    StreamRefused,
)
from swactor.transport.recv_edge import RecvEdge
from swactor.transport.send_edge import SendEdge
from swactor.transport.sinks import EmitEvent, EmitWake
from swactor.wire import EdgeId, EdgePreamble, PreambleError, StreamFaultReason
from swactor.wire.objects import PREAMBLE_LEN

StreamKey = tuple[QuicLink, int]

log = logging.getLogger("swactor.transport.driver")

ENDED_IDS_KEPT = 4096
"""How many forgotten edge ids the driver remembers for `DuplicateStream` refusals."""
ARRIVALS_KEPT = 256
"""How many of the latest stream arrivals `Driver.arrivals` keeps (one per run's inbound
edge; an audit trail, bounded so it does not grow for the life of the node)."""


class Driver:
    """Edge driver bound to one endpoint and one arena (see the module docstring)."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        arena: ArenaLike,
        emit: EmitEvent,
        wake: EmitWake,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.endpoint = endpoint
        self.arena = arena
        self.faults = faults
        """The fault port every send pump of this driver consults (`swactor.faults`)."""
        self.recv_edges: dict[int, RecvEdge] = {}
        self.send_edges: dict[int, SendEdge] = {}
        self.arrivals: deque[StreamArrived] = deque(maxlen=ARRIVALS_KEPT)
        """The latest streams that reached an edge (`ARRIVALS_KEPT`)."""
        self._emit = emit
        self._wake = wake
        self._expected: dict[int, int] = {}
        """Inbound edge id -> the node id of its producer (the active plan's)."""
        self._heads: dict[StreamKey, bytearray] = {}
        self._routed: dict[StreamKey, tuple[RecvEdge, InboundStream]] = {}
        self._refused: set[StreamKey] = set()
        self._by_ring_recv: dict[int, RecvEdge] = {}
        self._by_ring_send: dict[int, SendEdge] = {}
        self._ended: OrderedDict[int, None] = OrderedDict()
        self.wrong_producer = 0
        """Streams refused because their sender is not the edge's producer."""
        endpoint.register_handler(EDGE_ALPN, self)

    # -- spec §25 views -------------------------------------------------------------

    @property
    def recv_specs(self) -> dict[int, RecvEdge]:
        """Edges whose receive spec is registered and whose stream has not arrived."""
        return {e: r for e, r in self.recv_edges.items() if r.machine.state is State.HoldingSpec}

    @property
    def pending_streams(self) -> dict[int, InboundStream]:
        """Streams that arrived before their receive spec (held unread)."""
        return {
            e: r.inbound
            for e, r in self.recv_edges.items()
            if r.machine.state is State.HoldingStream and r.inbound is not None
        }

    # -- inbound messages -------------------------------------------------------------

    def expect_recv(self, edges: Iterable[tuple[int, int]]) -> None:
        """Declare the active plan's inbound edges as (edge id, producer node id):
        streams for other edges, or from other nodes, are refused."""
        self.forget_ended()
        self._expected.update(edges)

    def producer_of(self, edge_id: int) -> int | None:
        """The node id a stream for inbound `edge_id` must come from (None: unknown)."""
        return self._expected.get(edge_id)

    def forget_ended(self) -> None:
        """Drop the bindings whose pumps have ended, keeping their ids (module doc)."""
        ended: list[int] = []
        for recv_id, recv in list(self.recv_edges.items()):
            if recv.finished and (recv.task is None or recv.task.done()):
                del self.recv_edges[recv_id]
                ended.append(recv_id)
        for send_id, send in list(self.send_edges.items()):
            if send.finished and all(task.done() for task in send.tasks):
                del self.send_edges[send_id]
                ended.append(send_id)
        if not ended:
            return
        live_recv, live_send = set(self.recv_edges.values()), set(self.send_edges.values())
        self._by_ring_recv = {r: e for r, e in self._by_ring_recv.items() if e in live_recv}
        self._by_ring_send = {r: e for r, e in self._by_ring_send.items() if e in live_send}
        self._routed = {k: v for k, v in self._routed.items() if v[0] in live_recv}
        for edge_id in ended:
            self._expected.pop(edge_id, None)
            self._ended[edge_id] = None
        while len(self._ended) > ENDED_IDS_KEPT:
            self._ended.popitem(last=False)

    def handle(self, message: DriverMessage) -> None:
        if isinstance(message, EstablishRecv):
            self._establish_recv(message)
        elif isinstance(message, EstablishSend):
            self._establish_send(message)
        elif isinstance(message, StopEdge):
            self.stop_edge(message.edge_id)
        else:
            raise TransportError(f"driver: unknown message {type(message).__name__}")

    def _open_ring(self, edge_id: int, msg: EstablishRecv | EstablishSend) -> Ring | None:
        if int(msg.ring_layout.ring_id) != msg.ring_id:
            detail = f"ring_id {msg.ring_id} != layout ring_id {msg.ring_layout.ring_id}"
        else:
            try:
                return Ring.open(self.arena, msg.ring_layout)
            except RingError as exc:
                detail = str(exc)
        log.warning("edge %d: pump failed: %s", edge_id, detail)
        self._emit(StreamFault(EdgeId(edge_id), StreamFaultReason.PumpFailed))
        self._emit(PumpStopped(edge_id, msg.ring_id))
        return None

    def _establish_recv(self, msg: EstablishRecv) -> None:
        self.forget_ended()
        edge = self.recv_edges.get(msg.edge_id)
        if (
            (edge is not None and edge.ring is not None)
            or msg.edge_id in self.send_edges
            or msg.edge_id in self._ended
        ):
            raise TransportError(f"edge {msg.edge_id} is already established")
        ring = self._open_ring(msg.edge_id, msg)
        if ring is None:
            return
        self._expected[msg.edge_id] = msg.tx_node_id
        if edge is None:
            edge = self.recv_edges[msg.edge_id] = RecvEdge(msg.edge_id, self._emit, self._wake)
        self._by_ring_recv[msg.ring_id] = edge
        edge.establish(msg.ring_id, msg.ring_layout, ring)

    def _establish_send(self, msg: EstablishSend) -> None:
        self.forget_ended()
        if (
            msg.edge_id in self.send_edges
            or msg.edge_id in self.recv_edges
            or msg.edge_id in self._ended
        ):
            raise TransportError(f"edge {msg.edge_id} is already established")
        ring = self._open_ring(msg.edge_id, msg)
        if ring is None:
            return
        edge = SendEdge(
            self.endpoint,
            msg.edge_id,
            msg.rx_node_id,
            msg.ring_id,
            ring,
            self._emit,
            self._wake,
            self.faults,
        )
        self.send_edges[msg.edge_id] = edge
        self._by_ring_send[msg.ring_id] = edge
        edge.start()

    def stop_edge(self, edge_id: int) -> None:
        """Stop the edge's pump; `PumpStopped` follows (at once if it has no binding)."""
        recv, send = self.recv_edges.get(edge_id), self.send_edges.get(edge_id)
        if recv is not None and not recv.finished:
            recv.stop()
        elif send is not None and not send.finished:
            send.stop()
        elif recv is None and send is None:
            self._emit(PumpStopped(edge_id, None))

    async def wait_stopped(self, edge_id: int) -> None:
        """Wait until every task of the edge's binding has finished."""
        tasks: list[asyncio.Task[None]] = []
        recv, send = self.recv_edges.get(edge_id), self.send_edges.get(edge_id)
        if recv is not None and recv.task is not None:
            tasks.append(recv.task)
        if send is not None:
            tasks.extend(send.tasks)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        edges = list(self.recv_edges) + list(self.send_edges)
        for edge_id in edges:
            self.stop_edge(edge_id)
        for edge_id in edges:
            await self.wait_stopped(edge_id)

    # -- wake hints from the rings' other side ----------------------------------------

    def ring_readable(self, ring_id: int) -> None:
        edge = self._by_ring_send.get(ring_id)
        if edge is not None:
            edge.ring_readable()

    def ring_writable(self, ring_id: int) -> None:
        edge = self._by_ring_recv.get(ring_id)
        if edge is not None:
            edge.ring_writable()

    # -- LinkHandler ----------------------------------------------------------------

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        key = (link, stream_id)
        routed = self._routed.get(key)
        if routed is not None:
            routed[1].feed(data, end)
            return
        if key in self._refused:
            link.consume(stream_id, len(data))  # discard; keep the connection credited
            return
        if not stream_id & 2:
            link.consume(stream_id, len(data))
            self._refuse(key, None, StreamFaultReason.PreambleGarbage, "bidirectional stream")
            return
        head = self._heads.setdefault(key, bytearray())
        head += data
        if len(head) < PREAMBLE_LEN:
            if end:
                del self._heads[key]
                link.consume(stream_id, len(head))
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
            link.consume(stream_id, len(head))
            self._refuse(key, None, exc.reason, str(exc))
            return
        edge = self.recv_edges.get(edge_id)
        producer = self._expected.get(edge_id)
        if producer is not None and link.peer_node_id != producer:
            link.consume(stream_id, len(head))
            self.wrong_producer += 1
            self._refuse(
                key,
                None,  # not the edge's stream: the edge itself goes on (module doc)
                StreamFaultReason.PeerNotAllowed,
                f"edge {edge_id} stream from node {link.peer_node_id:#018x}; the plan's "
                f"producer is node {producer:#018x}",
            )
            return
        if (edge is not None and edge.finished) or (edge is None and edge_id in self._ended):
            link.consume(stream_id, len(head))
            self._refuse(key, edge_id, StreamFaultReason.DuplicateStream, "edge already ended")
            return
        if producer is None:
            link.consume(stream_id, len(head))
            self._refuse(key, edge_id, StreamFaultReason.UnknownEdge, "edge not in active plan")
            return
        link.consume(stream_id, PREAMBLE_LEN)
        if edge is None:
            edge = self.recv_edges[edge_id] = RecvEdge(edge_id, self._emit, self._wake)
        assert link.peer_node_id is not None
        self.arrivals.append(StreamArrived(edge_id, link.peer_node_id, stream_id))
        inbound = InboundStream(link, stream_id)
        inbound.feed(memoryview(head)[PREAMBLE_LEN:], end)
        if edge.inbound is None:
            self._routed[key] = (edge, inbound)
        else:
            self._refused.add(key)
        edge.stream_arrived(inbound)

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        key = (link, stream_id)
        link.quic.settle_stream(stream_id)  # its connection credit comes back
        link.transmit_soon()
        self._heads.pop(key, None)
        self._refused.discard(key)
        routed = self._routed.pop(key, None)
        if routed is None:
            return
        if error_code == STOPPED_CODE:
            routed[0].peer_stopped()  # the sender's graceful stop: not a fault
        else:
            routed[0].stream_failed(
                StreamFaultReason.PeerReset, f"peer reset the stream, code {error_code:#x}"
            )

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        """STOP_SENDING for one of our edge streams: the receiver stopped its end."""
        for send in self.send_edges.values():
            if send.link is link and send.stream_id == stream_id:
                send.peer_stopped(error_code)
                return

    def link_closed(self, link: QuicLink, reason: str) -> None:
        for key in [key for key in self._heads if key[0] is link]:
            del self._heads[key]
        for key in [key for key in self._routed if key[0] is link]:
            edge, _ = self._routed.pop(key)
            edge.stream_failed(lost_reason(reason), reason)
        self._refused = {key for key in self._refused if key[0] is not link}
        for send in self.send_edges.values():
            if send.link is link and not send.finished:
                send.link_lost(reason)

    # -- internals ------------------------------------------------------------------

    def _refuse(
        self, key: StreamKey, edge_id: int | None, reason: StreamFaultReason, detail: str
    ) -> None:
        """Stop a stream nobody will read; the caller credited what it already took,
        later bytes are credited as they come (see `stream_data`)."""
        link, stream_id = key
        self._refused.add(key)
        link.stop_stream(stream_id, ABORTED_CODE)  # a refusal: the sender faults
        self._emit(StreamRefused(edge_id, reason, detail))
