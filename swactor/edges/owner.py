"""`EdgeOwner`: what a Tx/Rx edge actor tells the actor that owns its edge (spec §27).

Theory of operation
-------------------
An edge actor reports coarse lifecycle facts to its owner - the StageController of a
stage node, or the orchestrator's token endpoint - through this small protocol, so the
edge actors do not depend on any one owner's message types:

- `edge_ready(edge_id, ring_id)`: the edge is established (EdgeReady);
- `edge_failed(edge_id, reason, component)`: the edge faulted, with the §36 run-level
  reason and the component that detected it;
- `edge_stopped(edge_id, clean)`: the edge is torn down (EdgeStopped), always sent in
  answer to a StopEdge.

`StageOwner` maps them onto the StageController's mail: `EdgeReady`,
`scm.EdgeFault`, `scm.EdgeStopped`. Objects are no owner's business here: GpuWorkerCtl
routes the worker's ObjectLoaded / ObjectProduced / ObjectFailed to the StageController
directly (fsm/rx_edge.yaml and tx_edge.yaml say why), and the orchestrator's token
endpoint reads its rings itself.
"""

from __future__ import annotations

from typing import Any, Protocol

from swactor.actors import ActorRef
from swactor.fsm.generated import stage_controller as scm
from swactor.wire import Component, EdgeId, EdgeReady, RingId, RunFaultReason


class EdgeOwner(Protocol):
    """The receiver of an edge actor's reports (module docstring)."""

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None: ...

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None: ...

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None: ...


class StageOwner:
    """An `EdgeOwner` that tells a StageController (or its StageHost)."""

    def __init__(self, controller: ActorRef[Any]) -> None:
        self.controller = controller

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None:
        self.controller.tell(EdgeReady(edge_id, ring_id))

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None:
        self.controller.tell(scm.EdgeFault(edge_id, reason, component))

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self.controller.tell(scm.EdgeStopped(edge_id, clean))
