"""`EdgeStagePorts`: the edge half of `StagePorts` (establish_inbound/outbound, stop_edges).

Theory of operation
-------------------
The StageController asks its ports to establish the stage's two edge ends and, at
teardown, to stop them (`swactor.node.stage_ports`). This class carries those out
against the node's EdgeEstablisher:

- `establish_inbound(provision)` asks the establisher for a ProvisionRx of the inbound
  edge bound to the role's input port, `establish_outbound` for a ProvisionTx of the
  outbound edge (consumer node from the provision) on the output port. The owner of
  both edge actors is a `StageOwner` of `stage` (the StageHost or the controller), so
  EdgeReady / EdgeFault / EdgeStopped come back as the controller's mail. A
  refused provisioning (the edge id already has a live record) raises `RunFaultError`
  with EdgeEstablishmentFailed.
- `stop_edges(inbound, outbound)` sends StopEdge to each edge's actor; the
  actor's EdgeStopped answers. An edge that was never provisioned (or whose actor is
  already gone) is answered `EdgeStopped(clean=True)` at once, as the port contract
  requires. A provisioning still in flight is awaited first, so a stop can never
  overtake the lease it must release.
"""

from __future__ import annotations

import asyncio
from typing import Any

from swactor.actors import ActorRef
from swactor.edges.messages import EdgeProvisioned, ProvisionEdge
from swactor.edges.owner import StageOwner
from swactor.fsm.generated import stage_controller as scm
from swactor.wire import (
    EdgeId,
    PortId,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    RunFaultError,
    RunFaultReason,
    RunId,
    StopEdge,
)


class EdgeStagePorts:
    """Edge ports of one node's stages (module docstring)."""

    def __init__(self, establisher: ActorRef[Any], stage: ActorRef[Any],
                 ask_timeout_s: float = 10.0) -> None:
        self.establisher = establisher
        self.stage = stage
        self.ask_timeout_s = ask_timeout_s
        self.edge_actors: dict[EdgeId, ActorRef[Any]] = {}
        self._input_edges: dict[PortId, EdgeId] = {}
        self._output_edges: dict[PortId, EdgeId] = {}
        self._in_flight: dict[EdgeId, asyncio.Future[None]] = {}

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        edge = provision.inbound
        await self._provision(
            ProvisionRx(edge.edge_id, edge.producer_node_id, edge.object_spec, edge.ring_spec),
            provision.runtime.input_port, provision.run_id,
        )

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        edge = provision.outbound
        await self._provision(
            ProvisionTx(edge.edge_id, edge.consumer_node_id, edge.object_spec, edge.ring_spec),
            provision.runtime.output_port, provision.run_id,
        )

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        for edge in (inbound, outbound):
            pending = self._in_flight.get(edge)
            if pending is not None:
                await asyncio.shield(pending)
            actor = self.edge_actors.pop(edge, None)
            if actor is None or not actor.tell(StopEdge(edge)):
                self.stage.tell(scm.EdgeStopped(edge, True))

    async def _provision(self, provision: ProvisionRx | ProvisionTx, port: PortId,
                         run_id: RunId) -> None:
        edge = provision.edge_id
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight[edge] = done
        try:
            answer = await self.establisher.ask(
                ProvisionEdge(provision, port, StageOwner(self.stage), run_id),
                self.ask_timeout_s)
            if not isinstance(answer, EdgeProvisioned):
                raise RunFaultError(RunFaultReason.EdgeEstablishmentFailed,
                                     getattr(answer, "detail", repr(answer)))
            self.edge_actors[edge] = answer.edge_actor
            ports = self._input_edges if isinstance(provision, ProvisionRx) else self._output_edges
            ports[port] = edge
        finally:
            del self._in_flight[edge]
            done.set_result(None)
