"""`EdgeOwner`: what a Tx/Rx edge actor tells the actor that owns its edge (spec §27).

Theory of operation
-------------------
An edge actor reports coarse lifecycle facts to its owner - the StageController of a
stage node, or the orchestrator's token endpoint - through this small protocol, so the
edge actors do not depend on any one owner's message types:

- `edge_ready(edge_id, ring_id)`: the edge is established (EdgeReady);
- `edge_failed(edge_id, reason, component)`: the edge faulted, with the §36 run-level
  reason and the component that detected it;
- `object_loaded(...)` / `object_produced(...)` / `object_failed(...)`: object events of
  the edge (delivered once, through the edge actor);
- `edge_stopped(edge_id, clean)`: the edge is torn down (EdgeStopped), always sent in
  answer to a StopEdge.

`StageOwner` maps them onto the StageController's mail: `EdgeEstablished`,
`scm.EdgeFault`, `scm.EdgeStopped`. It does not forward object events: GpuWorkerCtl
routes the worker's ObjectLoaded / ObjectProduced / ObjectFailed to the controller
directly (its `WorkerRoutes.stage_controllers`), so forwarding them again would deliver
each twice (it is a `LifecycleOwner`, whose object methods do nothing; so is the
orchestrator's token endpoint, which reads its rings itself). Test owners such as
`RecordingOwner` see everything.
"""

from __future__ import annotations

from typing import Any, Protocol

from swactor.actors import ActorRef
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_ports import EdgeEstablished
from swactor.wire import (
    Component,
    DeviceObjectHandle,
    EdgeId,
    ObjectFailure,
    ObjectId,
    RingId,
    RunFaultReason,
    Sequence,
)


class EdgeOwner(Protocol):
    """The receiver of an edge actor's reports (module docstring)."""

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None: ...

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None: ...

    def object_loaded(self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence,
                      device_handle: DeviceObjectHandle) -> None: ...

    def object_produced(self, edge_id: EdgeId, object_id: ObjectId) -> None: ...

    def object_failed(self, edge_id: EdgeId, object_id: ObjectId | None,
                      reason: ObjectFailure) -> None: ...

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None: ...


class LifecycleOwner:
    """The object half of `EdgeOwner` for owners that want lifecycle reports only: a
    StageController has object events from GpuWorkerCtl already, and the orchestrator's
    token endpoint reads its rings itself."""

    def object_loaded(self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence,
                      device_handle: DeviceObjectHandle) -> None:
        pass

    def object_produced(self, edge_id: EdgeId, object_id: ObjectId) -> None:
        pass

    def object_failed(self, edge_id: EdgeId, object_id: ObjectId | None,
                      reason: ObjectFailure) -> None:
        pass


class StageOwner(LifecycleOwner):
    """An `EdgeOwner` that tells a StageController (or its StageHost)."""

    def __init__(self, controller: ActorRef[Any]) -> None:
        self.controller = controller

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None:
        self.controller.tell(EdgeEstablished(edge_id, ring_id))

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None:
        self.controller.tell(scm.EdgeFault(edge_id, reason, component))

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self.controller.tell(scm.EdgeStopped(edge_id, clean))
