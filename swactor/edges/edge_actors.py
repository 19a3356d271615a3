"""The Tx and Rx edge actors (spec §27): role-facing lifecycle gates of one edge end.

Theory of operation
-------------------
The EdgeEstablisher spawns one per provisioned edge end: `TxEdgeActor` (generated
`tx_edge` machine) for ProvisionTx, `RxEdgeActor` (`rx_edge`) for ProvisionRx. Each
translates its mail into machine events and carries out the effects:

- from the establisher: `EdgeUp` -> EdgeReady, `EdgeDown` -> EdgeFailed, `EdgeGone` ->
  EdgeStopped;
- from its owner: `StopEdge` (the machine's own event);
- from the driver: a StreamFault for this edge.

Objects do not pass through these actors: GpuWorkerCtl routes the worker's object
events to the StageController (fsm/rx_edge.yaml and tx_edge.yaml say why); the ring
events GpuWorkerCtl sends to an edge actor (`WorkerRoutes.edges`: RingInstalled,
RingQuiesced, RingFault) are the establisher's business and are ignored here.

Effects become `EdgeOwner` calls (`owner.py`) and `ForwardStopEdge` a `StopEdge` to the
establisher's record. The actor never sees bytes, pointers, ranges or credits. An event
the machine refuses in its state is logged and dropped: a late report must not crash
the gate. The actor stops itself once its machine is Stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from swactor.actors import Actor, ActorRef, Context
from swactor.edges.messages import EdgeDown, EdgeGone, EdgeUp
from swactor.edges.owner import EdgeOwner
from swactor.fsm.generated import rx_edge as rx
from swactor.fsm.generated import tx_edge as tx
from swactor.fsm.runtime import ProtocolError
from swactor.wire import (
    Component,
    EdgeId,
    RingId,
    RunFaultReason,
    StopEdge,
    StreamFault,
    StreamFaultReason,
)

log = logging.getLogger("swactor.edges.edge_actors")

_COMPONENTS: dict[RunFaultReason, Component] = {
    RunFaultReason.RingFault: Component.Worker,
    RunFaultReason.StreamFault: Component.Driver,
    RunFaultReason.PumpFailed: Component.Driver,
    RunFaultReason.ArenaPressureTimeout: Component.ArenaManager,
    RunFaultReason.RingRequestOversized: Component.ArenaManager,
}


NOT_ESTABLISHED = frozenset({StreamFaultReason.HandshakeFailed,
                             StreamFaultReason.PeerNotAllowed})
"""Stream faults that mean the edge's connection was never made (spec §36 edge
establishment failure), not that an established stream broke (StreamFault)."""


def _component(reason: RunFaultReason, own: Component) -> Component:
    if reason is RunFaultReason.SequenceViolation:
        return own
    return _COMPONENTS.get(reason, Component.EdgeEstablisher)


class _EdgeActor(Actor[Any]):
    """What the Tx and Rx actors share: mail translation and the common effects."""

    component: Component

    def __init__(
        self,
        edge_id: EdgeId,
        owner: EdgeOwner,
        establisher: ActorRef[Any],
        worker_ctl: ActorRef[Any] | None = None,
    ) -> None:
        self.edge_id = edge_id
        self.owner = owner
        self.establisher = establisher
        self.worker_ctl = worker_ctl
        self.ring_id: RingId | None = None

    def _translate(self, message: Any) -> Any:
        raise NotImplementedError

    def _stopped(self) -> bool:
        raise NotImplementedError

    def _effect(self, effect: Any) -> None:
        raise NotImplementedError

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        event = self._translate(message)
        if event is None:
            return
        try:
            effects = self._handle(event)
        except ProtocolError as exc:
            log.warning("edge %d: %s", int(self.edge_id), exc)
            return
        for effect in effects:
            self._effect(effect)
        if self._stopped():
            ctx.stop_self()

    def _handle(self, event: Any) -> list[Any]:
        raise NotImplementedError

    def _fault(self, reason: RunFaultReason) -> None:
        self.owner.edge_failed(self.edge_id, reason, _component(reason, self.component))

    def _stream_fault(self, reason: StreamFaultReason) -> None:
        run_reason = (RunFaultReason.EdgeEstablishmentFailed if reason in NOT_ESTABLISHED
                      else RunFaultReason.StreamFault)
        self.owner.edge_failed(self.edge_id, run_reason, Component.Driver)


class TxEdgeActor(_EdgeActor):
    """The producer end's gate (generated `tx_edge` machine)."""

    component = Component.TxEdge

    def __init__(self, edge_id: EdgeId, owner: EdgeOwner, establisher: ActorRef[Any],
                 worker_ctl: ActorRef[Any] | None = None) -> None:
        super().__init__(edge_id, owner, establisher, worker_ctl)
        self.machine = tx.TxEdgeMachine(self)

    def _stopped(self) -> bool:
        return self.machine.state is tx.State.Stopped

    def _handle(self, event: Any) -> list[Any]:
        return list(self.machine.handle(event))

    def _translate(self, message: Any) -> tx.Event | None:
        match message:
            case EdgeUp(ring_id=ring_id):
                self.ring_id = ring_id
                return tx.EdgeReady(self.edge_id)
            case EdgeDown(reason=reason):
                return tx.EdgeFailed(self.edge_id, reason)
            case EdgeGone(clean=clean):
                return tx.EdgeStopped(self.edge_id, clean)
            case StopEdge():
                return message
            case StreamFault():
                return message
        return None

    def _effect(self, effect: Any) -> None:
        match effect:
            case tx.ReportEdgeReady():
                assert self.ring_id is not None
                self.owner.edge_ready(self.edge_id, self.ring_id)
            case tx.ReportEdgeFailed(reason=reason):
                self._fault(reason)
            case tx.ReportStreamFault(reason=reason):
                self._stream_fault(reason)
            case tx.ForwardStopEdge():
                self.establisher.tell(StopEdge(self.edge_id))
            case tx.ReportEdgeStopped(clean=clean):
                self.owner.edge_stopped(self.edge_id, clean)


class RxEdgeActor(_EdgeActor):
    """The consumer end's gate (generated `rx_edge` machine)."""

    component = Component.RxEdge

    def __init__(self, edge_id: EdgeId, owner: EdgeOwner, establisher: ActorRef[Any],
                 worker_ctl: ActorRef[Any] | None = None) -> None:
        super().__init__(edge_id, owner, establisher, worker_ctl)
        self.machine = rx.RxEdgeMachine(self)

    def _stopped(self) -> bool:
        return self.machine.state is rx.State.Stopped

    def _handle(self, event: Any) -> list[Any]:
        return list(self.machine.handle(event))

    def _translate(self, message: Any) -> rx.Event | None:
        match message:
            case EdgeUp(ring_id=ring_id):
                self.ring_id = ring_id
                return rx.EdgeReady(self.edge_id)
            case EdgeDown(reason=reason):
                return rx.EdgeFailed(self.edge_id, reason)
            case EdgeGone(clean=clean):
                return rx.EdgeStopped(self.edge_id, clean)
            case StopEdge():
                return message
            case StreamFault():
                return message
        return None

    def _effect(self, effect: Any) -> None:
        match effect:
            case rx.ReportEdgeReady():
                assert self.ring_id is not None
                self.owner.edge_ready(self.edge_id, self.ring_id)
            case rx.ReportEdgeFailed(reason=reason):
                self._fault(reason)
            case rx.ReportStreamFault(reason=reason):
                self._stream_fault(reason)
            case rx.ForwardStopEdge():
                self.establisher.tell(StopEdge(self.edge_id))
            case rx.ReportEdgeStopped(clean=clean):
                self.owner.edge_stopped(self.edge_id, clean)
