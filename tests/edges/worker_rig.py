"""An `EdgeNode` whose rings live in a real GPU worker process.

`attach_worker` (before `EdgeNode.start`) spawns GpuWorkerCtl over the node's arena
(no restarts: a killed worker stays dead) and makes a `WorkerRingInstaller` the node's
ring installer, with the worker's wake doorbells as a node has them. `start_worker`
(after `start`) routes the worker's mail to the node's establisher and driver, binds the
doorbells' wake route to the driver, starts `python -m swactor.worker` and waits for it
to be ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from swactor.actors import ActorRef, Runtime
from swactor.edges import WorkerRingInstaller
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.node.worker_ctl import GpuWorkerCtl, WorkerCtlConfig, WorkerReadyNotice, WorkerRoutes
from swactor.ring import WorkerDoorbells
from tests.edges.rig import EdgeNode
from tests.worker.ctl_rig import Collector, take


@dataclass
class NodeWorker:
    """The worker's controller, its routes, and the node-boot mail it sends."""

    ctl: ActorRef[Any]
    routes: WorkerRoutes
    boot: asyncio.Queue[Any]
    installer: WorkerRingInstaller


def attach_worker(runtime: Runtime, node: EdgeNode) -> NodeWorker:
    boot: asyncio.Queue[Any] = asyncio.Queue()
    routes = WorkerRoutes(node_boot=runtime.spawn(lambda: Collector(boot), "boot"))
    arena = node.arena
    config = WorkerCtlConfig(arena.fd, arena.size, max_restarts=0)
    bells = WorkerDoorbells.create()
    ctl = runtime.spawn(lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells),
                        "gpu-worker", mailbox_capacity=1024)
    installer = node.installer = WorkerRingInstaller(ctl, routes.edges, bells)
    return NodeWorker(ctl, routes, boot, installer)


async def start_worker(node: EdgeNode, worker: NodeWorker) -> WorkerReadyNotice:
    worker.routes.establisher, worker.routes.driver = node.establisher, node.driver
    assert worker.installer.route is not None
    worker.installer.route.bind(node.driver_actor.driver)
    worker.ctl.tell(gwc.StartWorker())
    ready: WorkerReadyNotice = await take(worker.boot, WorkerReadyNotice)
    return ready
