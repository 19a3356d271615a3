"""Driver messages and events (spec §24), and the wake hints the pumps emit (spec §21).

Inbound: `EstablishSend`, `EstablishRecv`, `StopEdge` (and `StreamArrived`, which the
driver's own demux produces when an edge stream's preamble has been read). Outbound:
`DriverEdgeReady`, `StreamClosed`, `StreamFault`, `StreamRefused`, `PumpStopped`, plus
wake hints `RingReadable` / `RingWritable` for the process on the other side of a ring.
`StopEdge`, `DriverEdgeReady`, `StreamFault` and the wake hints are the `swactor.wire`
classes the edge and pump tables take and make (`wire: true`), so no layer converts them.

As in the spec, `EstablishSend`/`EstablishRecv` carry the ring's `RingLayout`: the
driver opens its own handle on the node's arena (the ring header was written by whoever
installed the ring). No message carries payload bytes, byte ranges or credits.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.wire import (
    DriverEdgeReady,
    RingLayout,
    RingReadable,
    RingWritable,
    StopEdge,
    StreamFault,
    StreamFaultReason,
)


@dataclass(frozen=True, slots=True)
class EstablishSend:
    """Start the send side of `edge_id`: egress `ring` -> stream to `rx_node_id`."""

    edge_id: int
    rx_node_id: int
    ring_id: int
    ring_layout: RingLayout
    tx_addr: object = None


@dataclass(frozen=True, slots=True)
class EstablishRecv:
    """Start the receive side of `edge_id`: its stream from `tx_node_id` (the plan's
    producer; a stream from any other peer is refused) -> ingress `ring`."""

    edge_id: int
    tx_node_id: int
    ring_id: int
    ring_layout: RingLayout
    rx_addr: object = None


@dataclass(frozen=True, slots=True)
class StreamArrived:
    """A peer stream whose preamble named `edge_id` (produced by the demux itself)."""

    edge_id: int
    peer_node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class PumpStopped:
    """The pump of `edge_id` will never touch `ring_id` again (a quiescence proof).
    `ring_id` is None for an edge stopped before its ring was named."""

    edge_id: int
    ring_id: int | None


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """The edge stream ended cleanly (FIN); `offset` = payload bytes after the preamble."""

    edge_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class StreamRefused:
    """A stream that is none of this node's edges was refused and stopped. `edge_id` is
    None when its preamble never named one; otherwise it named an edge this node does not
    run (UnknownEdge), one that already ended (DuplicateStream), or one whose producer is
    another node (PeerNotAllowed). No edge is affected: this is for the log."""

    edge_id: int | None
    reason: StreamFaultReason
    detail: str


DriverMessage = EstablishSend | EstablishRecv | StopEdge
DriverEvent = DriverEdgeReady | StreamClosed | StreamFault | StreamRefused | PumpStopped
WakeHint = RingReadable | RingWritable

__all__ = [
    "DriverEdgeReady",
    "DriverEvent",
    "DriverMessage",
    "EstablishRecv",
    "EstablishSend",
    "PumpStopped",
    "RingReadable",
    "RingWritable",
    "StopEdge",
    "StreamArrived",
    "StreamClosed",
    "StreamFault",
    "StreamRefused",
    "WakeHint",
]
