"""The Tx and Rx edge actors (spec §27): role-facing lifecycle gates of one edge end.

Theory of operation
-------------------
The EdgeEstablisher spawns one per provisioned edge end: `TxEdgeActor` (generated
`tx_edge` machine) for ProvisionTx, `RxEdgeActor` (`rx_edge`) for ProvisionRx. Both
tables take the same `swactor.wire` events, which the actor feeds as they come, and
name the same effects, which it carries out (one actor class binds either table):

- from the establisher: `EdgeReady`, `EdgeFailed`, `EdgeStopped`;
- from its owner: `StopEdge`.

A driver's `StreamFault` does not come here: it goes to the edge's record, whose table
(`edge_record`: `never_connected`, `pump_failed`) decides the run-level reason and
sends it as `EdgeFailed`; the actor maps no reason itself.

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
from swactor.edges.owner import EdgeOwner
from swactor.fsm.generated import rx_edge as rx
from swactor.fsm.generated import tx_edge as tx
from swactor.fsm.runtime import ProtocolError
from swactor.wire import (
    Component,
    EdgeFailed,
    EdgeId,
    EdgeReady,
    EdgeStopped,
    RunFaultReason,
    StopEdge,
)

log = logging.getLogger("swactor.edges.edge_actors")

_COMPONENTS: dict[RunFaultReason, Component] = {
    RunFaultReason.RingFault: Component.Worker,
    RunFaultReason.StreamFault: Component.Driver,
    RunFaultReason.PumpFailed: Component.Driver,
    RunFaultReason.ArenaPressureTimeout: Component.ArenaManager,
    RunFaultReason.RingRequestOversized: Component.ArenaManager,
}


def _component(reason: RunFaultReason, own: Component) -> Component:
    if reason is RunFaultReason.SequenceViolation:
        return own
    return _COMPONENTS.get(reason, Component.EdgeEstablisher)


class _EdgeActor(Actor[Any]):
    """The Tx or Rx gate: both tables take the same events and name the same effects,
    so one actor binds either; a subclass names its table (`gen`) and its component."""

    component: Component
    gen: Any
    """The generated module, `tx_edge` or `rx_edge`."""

    def __init__(
        self,
        edge_id: EdgeId,
        owner: EdgeOwner,
        establisher: ActorRef[Any],
    ) -> None:
        self.edge_id = edge_id
        self.owner = owner
        self.establisher = establisher
        self.machine = self._machine()

    def _machine(self) -> Any:
        raise NotImplementedError

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if not isinstance(message, _EVENTS):
            return  # the ring events GpuWorkerCtl routes here (module doc)
        try:
            effects = list(self.machine.handle(message))
        except ProtocolError as exc:
            log.warning("edge %d: %s", int(self.edge_id), exc)
            return
        for effect in effects:
            self._effect(effect)
        if self.machine.state is self.gen.State.Stopped:
            ctx.stop_self()

    def _effect(self, effect: Any) -> None:
        gen = self.gen
        match effect:
            case gen.ReportEdgeReady(ring_id=ring_id):
                self.owner.edge_ready(self.edge_id, ring_id)
            case gen.ReportEdgeFailed(reason=reason):
                self._fault(reason)
            case gen.ForwardStopEdge():
                self.establisher.tell(StopEdge(self.edge_id))
            case gen.ReportEdgeStopped(clean=clean):
                self.owner.edge_stopped(self.edge_id, clean)

    def _fault(self, reason: RunFaultReason) -> None:
        self.owner.edge_failed(self.edge_id, reason, _component(reason, self.component))


_EVENTS = (EdgeReady, EdgeFailed, EdgeStopped, StopEdge)
"""The mail both tables take as it is (all `swactor.wire` classes)."""


class TxEdgeActor(_EdgeActor):
    """The producer end's gate (generated `tx_edge` machine)."""

    component = Component.TxEdge
    gen = tx

    def _machine(self) -> tx.TxEdgeMachine:
        return tx.TxEdgeMachine(self)


class RxEdgeActor(_EdgeActor):
    """The consumer end's gate (generated `rx_edge` machine)."""

    component = Component.RxEdge
    gen = rx

    def _machine(self) -> rx.RxEdgeMachine:
        return rx.RxEdgeMachine(self)
