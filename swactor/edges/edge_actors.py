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
from swactor.fsm.host import MachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.wire import (
    Component,
    EdgeFailed,
    EdgeId,
    EdgeReady,
    EdgeStopped,
    RingId,
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
    so one class implements the effects of either; a subclass builds its table's machine
    and host (`_bind`) and names its component."""

    component: Component

    def __init__(
        self,
        edge_id: EdgeId,
        owner: EdgeOwner,
        establisher: ActorRef[Any],
    ) -> None:
        self.edge_id = edge_id
        self.owner = owner
        self.establisher = establisher
        self._bind()

    def _bind(self) -> None:
        raise NotImplementedError

    @property
    def is_stopped(self) -> bool:
        raise NotImplementedError

    def _feed(self, event: Any) -> None:
        raise NotImplementedError

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if not isinstance(message, _EVENTS):
            return  # the ring events GpuWorkerCtl routes here (module doc)
        self._feed(message)
        if self.is_stopped:
            ctx.stop_self()

    def _rejected(self, event: object, error: ProtocolError) -> None:
        log.warning("edge %d: %s", int(self.edge_id), error)

    # -- effects (TxEdgeEffects and RxEdgeEffects) ---------------------------------------

    def report_edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None:
        self.owner.edge_ready(edge_id, ring_id)

    def report_edge_failed(self, edge_id: EdgeId, reason: RunFaultReason) -> None:
        self.owner.edge_failed(edge_id, reason, _component(reason, self.component))

    def forward_stop_edge(self, edge_id: EdgeId) -> None:
        self.establisher.tell(StopEdge(edge_id))

    def report_edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self.owner.edge_stopped(edge_id, clean)


_EVENTS = (EdgeReady, EdgeFailed, EdgeStopped, StopEdge)
"""The mail both tables take as it is (all `swactor.wire` classes)."""


class TxEdgeActor(_EdgeActor, tx.TxEdgeEffects[None]):
    """The producer end's gate (generated `tx_edge` machine)."""

    component = Component.TxEdge

    def _bind(self) -> None:
        self.machine = tx.TxEdgeMachine(self)
        self._host = MachineHost(self.machine, tx.bind(self), rejected=self._rejected)

    @property
    def is_stopped(self) -> bool:
        return self.machine.state is tx.State.Stopped

    def _feed(self, event: tx.Event) -> None:
        self._host.feed(event)


class RxEdgeActor(_EdgeActor, rx.RxEdgeEffects[None]):
    """The consumer end's gate (generated `rx_edge` machine)."""

    component = Component.RxEdge

    def _bind(self) -> None:
        self.machine = rx.RxEdgeMachine(self)
        self._host = MachineHost(self.machine, rx.bind(self), rejected=self._rejected)

    @property
    def is_stopped(self) -> bool:
        return self.machine.state is rx.State.Stopped

    def _feed(self, event: rx.Event) -> None:
        self._host.feed(event)
