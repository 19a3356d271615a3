"""The Tx and Rx edge actors (spec §27): role-facing lifecycle gates of one edge end.

Theory of operation
-------------------
The EdgeEstablisher spawns one per provisioned edge end: `TxEdgeActor` (generated
`tx_edge` machine) for ProvisionTx, `RxEdgeActor` (`rx_edge`) for ProvisionRx. Each
translates its mail into machine events and carries out the effects:

- from the establisher: `EdgeUp` -> EdgeReady, `EdgeDown` -> EdgeFailed, `EdgeGone` ->
  EdgeStopped;
- from its owner: `StopEdgeRequest` -> StopEdge (and the machine's own events,
  ProduceObject / ObjectConsumed);
- from GpuWorkerCtl (its `WorkerRoutes.edges` entry): the worker's ObjectLoaded,
  ObjectProduced, ObjectFailed for this edge; ring events (RingInstalled, RingQuiesced,
  RingFault, wake hints) are the establisher's business and are ignored here;
- from the driver: a StreamFault for this edge.

Effects become `EdgeOwner` calls (`owner.py`), `ForwardStopEdge` a `StopEdge` to the
establisher's record, `DiscardObject` a ReleaseDeviceObject to GpuWorkerCtl (when the
actor was given it). The actor never sees bytes, pointers, ranges or credits. An event
the machine refuses in its state is logged and dropped: a late report must not crash
the gate. The actor stops itself once its machine is Stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from swactor.actors import Actor, ActorRef, Context
from swactor.edges.messages import EdgeDown, EdgeGone, EdgeUp, StopEdgeRequest
from swactor.edges.owner import EdgeOwner
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import rx_edge as rx
from swactor.fsm.generated import tx_edge as tx
from swactor.fsm.runtime import ProtocolError
from swactor.transport import messages as tm
from swactor.wire import Component, EdgeId, RingId, RunFaultReason, StreamFaultReason
from swactor.wire import ObjectFailed as WireObjectFailed
from swactor.wire import ObjectLoaded as WireObjectLoaded
from swactor.wire import ObjectProduced as WireObjectProduced

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
        self.expected_object: int | None = None

    def is_expected_object(self, event: tx.ObjectProduced) -> bool:
        return self.expected_object is not None and int(event.object_id) == self.expected_object

    def _stopped(self) -> bool:
        return self.machine.state is tx.State.Stopped

    def _handle(self, event: Any) -> list[Any]:
        if isinstance(event, tx.ProduceObject):
            self.expected_object = int(event.object_id)
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
            case StopEdgeRequest():
                return tx.StopEdge(self.edge_id)
            case WireObjectProduced(object_id=object_id):
                return tx.ObjectProduced(self.edge_id, object_id)
            case WireObjectFailed(object_id=object_id, reason=reason):
                return tx.ObjectFailed(self.edge_id, object_id, reason)
            case tm.StreamFault(reason=reason):
                return tx.StreamFault(self.edge_id, reason)
            case tx.ProduceObject() | tx.StopEdge() | tx.ObjectProduced() | tx.ObjectFailed():
                return message
        return None

    def _effect(self, effect: Any) -> None:
        match effect:
            case tx.ReportEdgeReady():
                assert self.ring_id is not None
                self.owner.edge_ready(self.edge_id, self.ring_id)
            case tx.ReportObjectProduced(object_id=object_id):
                self.expected_object = None
                self.owner.object_produced(self.edge_id, object_id)
            case tx.ReportEdgeFailed(reason=reason):
                self._fault(reason)
            case tx.ReportObjectFailed(object_id=object_id, reason=reason):
                self.owner.object_failed(self.edge_id, object_id, reason)
            case tx.ReportStreamFault(reason=reason):
                self._stream_fault(reason)
            case tx.ForwardStopEdge():
                self.establisher.tell(er.StopEdge(self.edge_id))
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
            case StopEdgeRequest():
                return rx.StopEdge(self.edge_id)
            case WireObjectLoaded(object_id=object_id, sequence=sequence,
                                  device_handle=handle):
                return rx.ObjectLoaded(self.edge_id, object_id, sequence, handle)
            case WireObjectFailed(object_id=object_id, reason=reason):
                return rx.ObjectFailed(self.edge_id, object_id, reason)
            case tm.StreamFault(reason=reason):
                return rx.StreamFault(self.edge_id, reason)
            case rx.ObjectConsumed() | rx.StopEdge() | rx.ObjectLoaded() | rx.ObjectFailed():
                return message
        return None

    def _effect(self, effect: Any) -> None:
        match effect:
            case rx.ReportEdgeReady():
                assert self.ring_id is not None
                self.owner.edge_ready(self.edge_id, self.ring_id)
            case rx.DeliverObject(object_id=object_id, sequence=sequence,
                                  device_handle=handle):
                self.owner.object_loaded(self.edge_id, object_id, sequence, handle)
            case rx.DiscardObject(device_handle=handle):
                if self.worker_ctl is not None:
                    self.worker_ctl.tell(gwc.ReleaseDeviceObject(handle))
            case rx.ReportEdgeFailed(reason=reason):
                self._fault(reason)
            case rx.ReportObjectFailed(object_id=object_id, reason=reason):
                self.owner.object_failed(self.edge_id, object_id, reason)
            case rx.ReportStreamFault(reason=reason):
                self._stream_fault(reason)
            case rx.ForwardStopEdge():
                self.establisher.tell(er.StopEdge(self.edge_id))
            case rx.ReportEdgeStopped(clean=clean):
                self.owner.edge_stopped(self.edge_id, clean)
