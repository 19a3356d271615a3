"""In-process messages of the shared vocabulary: facts one actor tells another.

Theory of operation
-------------------
A fact that crosses from one component to another is one class, defined once, here or
in the wire modules beside this one (worker commands and events, plan and provisioning
types), so that grep finds it and nothing translates between copies. Unlike the other
wire types these never leave the process: they are plain frozen dataclasses without the
JSON codec or the construction-time checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.wire.enums import RunFaultReason, StreamFaultReason
from swactor.wire.ids import EdgeId, RingId


@dataclass(frozen=True, slots=True)
class WorkerReaped:
    """The worker process that mapped `ring_id` is gone and reaped (GpuWorkerCtl): no
    worker maps the ring any more, so its lease may be released (spec §38)."""

    ring_id: RingId


@dataclass(frozen=True, slots=True)
class StopEdge:
    """Stop `edge_id` (spec §38): to its edge actor, record, teardown and pump."""

    edge_id: EdgeId


@dataclass(frozen=True, slots=True)
class DriverEdgeReady:
    """The Driver's end of `edge_id` is up (spec §24). Send side: a verified connection
    to the consumer exists. Receive side: the receive spec is registered, so the stream
    will be paired whenever it arrives."""

    edge_id: EdgeId


@dataclass(frozen=True, slots=True)
class StreamFault:
    """The stream of `edge_id` failed (spec §24, §37): its pump's fault, which the
    edge's record, teardown and edge actor all take. The transport logs the detail
    where the fault arises; a stream that is none of this node's edges is refused
    instead (`swactor.transport.messages.StreamRefused`)."""

    edge_id: EdgeId
    reason: StreamFaultReason


@dataclass(frozen=True, slots=True)
class EdgeReady:
    """The edge record of `edge_id` reached Ready on ring `ring_id` (spec §27): the
    EdgeEstablisher tells the edge's Tx or Rx actor."""

    edge_id: EdgeId
    ring_id: RingId


@dataclass(frozen=True, slots=True)
class EdgeFailed:
    """The edge record of `edge_id` failed (lease rejected or timed out, ring or stream
    fault); `reason` is the spec §36 run-level source (EdgeEstablisher to edge actor)."""

    edge_id: EdgeId
    reason: RunFaultReason


@dataclass(frozen=True, slots=True)
class EdgeStopped:
    """The edge record of `edge_id` answered StopEdge (spec §38); `clean` says whether its
    teardown released everything (EdgeEstablisher to edge actor)."""

    edge_id: EdgeId
    clean: bool
