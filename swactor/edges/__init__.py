"""Edge establishment (spec §26, §27, §38): the EdgeEstablisher and the Tx/Rx edge actors.

- `establisher.py`: `EdgeEstablisher`, one per node; per-edge records bound to the
  generated `edge_record` machine, teardown bound to `edge_teardown`.
- `edge_actors.py`: `TxEdgeActor` / `RxEdgeActor` (`tx_edge` / `rx_edge` machines), the
  role-facing gates that report to an `EdgeOwner` (`owner.py`; `StageOwner` for a
  StageController).
- `installer.py`: `RingInstaller` and its two ends: `WorkerRingInstaller` (GpuWorkerCtl)
  and `LocalRingInstaller` (the orchestrator's token endpoint); `WakeFanout` routes the
  driver's wake hints to them.
- `stage_ports.py`: `EdgeStagePorts`, the establish/stop edge ports a StageController
  needs (its `StagePorts` edge half).
- `arena_actor.py`: `ArenaActor`, the node's ArenaManager behind one mailbox.
- `driver_actor.py`: `DriverActor`, the node's transport Driver behind a mailbox.
- `messages.py`: the mail between them.

Wiring one node (see `tests/edges/rig.py` for a complete, runnable example)::

    manager = ArenaManager(ceiling); manager.construct(); minter = manager.take_minter()
    arena = runtime.spawn(lambda: ArenaActor(manager), "arena")
    installer = WorkerRingInstaller(worker_ctl_ref, routes.edges)       # or LocalRingInstaller
    driver = runtime.spawn(lambda: DriverActor(endpoint, manager.arena, WakeFanout(installer)))
    establisher = runtime.spawn(lambda: EdgeEstablisher(EstablisherConfig(
        node_id, arena, driver, installer, minter)))
    routes.establisher = establisher; routes.driver = driver      # GpuWorkerCtl's routes
    answer = await establisher.ask(ProvisionEdge(provision_tx(edge), port, owner), 5.0)
    answer.edge_actor.tell(StopEdge(edge_id))               # owner stops the edge
"""

from swactor.edges.arena_actor import (
    ArenaActor,
    ArenaCancel,
    ArenaLease,
    ArenaLiveLeases,
    ArenaRelease,
    ArenaShutdown,
)
from swactor.edges.driver_actor import DriverActor, ExpectRecv, RouteDriverEvents
from swactor.edges.edge_actors import RxEdgeActor, TxEdgeActor
from swactor.edges.establisher import EdgeEstablisher, EstablisherConfig
from swactor.edges.installer import (
    LocalRingInstaller,
    RingInstaller,
    WakeFanout,
    WorkerRingInstaller,
)
from swactor.edges.messages import (
    EdgeProvisioned,
    EdgeRefused,
    EdgeReleases,
    EdgeStates,
    ProvisionEdge,
)
from swactor.edges.owner import EdgeOwner, StageOwner
from swactor.edges.stage_ports import EdgeStagePorts
from swactor.wire import StopEdge

__all__ = [
    "ArenaActor",
    "ArenaCancel",
    "ArenaLease",
    "ArenaLiveLeases",
    "ArenaRelease",
    "ArenaShutdown",
    "DriverActor",
    "EdgeEstablisher",
    "EdgeOwner",
    "EdgeProvisioned",
    "EdgeRefused",
    "EdgeReleases",
    "EdgeStagePorts",
    "EdgeStates",
    "EstablisherConfig",
    "ExpectRecv",
    "LocalRingInstaller",
    "ProvisionEdge",
    "RingInstaller",
    "RouteDriverEvents",
    "RxEdgeActor",
    "StageOwner",
    "StopEdge",
    "TxEdgeActor",
    "WakeFanout",
    "WorkerRingInstaller",
]
