"""Ring installers: who maps a leased ring on the far side of the node's pump (spec §26).

Theory of operation
-------------------
After the ArenaManager granted an edge's ring, the EdgeEstablisher hands it to a
`RingInstaller`, the owner of the ring's *other* end: the GPU worker process on a stage
node, or the orchestrator's local token endpoint. The installer answers the
establisher with the §30 events a worker would send: `RingInstalled` after `install`,
`RingQuiesced` after `uninstall` (or, for a worker that died, GpuWorkerCtl's
`WorkerReaped`), `RingFault` when its end faults. It also carries the driver's wake
hints to its end of the ring (`wake`, True when the ring is one of its own).

- `WorkerRingInstaller` sends GpuWorkerCtl's `InstallRing` / `UninstallRing`; GpuWorkerCtl
  answers through its routes (the establisher and the ring's edge actor, which this
  installer registers in `edge_routes`, GpuWorkerCtl's `WorkerRoutes.edges`, so object
  events reach it). Given the worker's `WorkerDoorbells` (the node does), its `route`
  (`swactor.transport.WorkerWakeRoute`) carries the wake hints both ways on the event
  loop: the driver's ring the worker's `to_worker` doorbell and the worker's call the
  driver for the rings this installer gave it (`route.bind(driver)` once the driver
  exists). Without doorbells the hints go to GpuWorkerCtl as they are (its table takes
  the same `RingReadable` / `RingWritable` classes) and travel as JSON lines.
- `LocalRingInstaller` is the token endpoint's end, in this process: it opens its own
  `Ring` handle on the arena (the header was written by the ArenaManager) and answers
  at once. `ring(edge_id)` gives the endpoint its handle; `wake_event(ring_id)` is set by
  the driver's wake hints (the endpoint waits on it with the §21 pending-bit protocol).
  Uninstall closes the handle: nothing in this process touches the ring afterwards.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from swactor.actors import ActorRef
from swactor.arena import Arena
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.ring import Ring, RingError, WorkerDoorbells
from swactor.transport.doorbells import WorkerWakeRoute
from swactor.transport.messages import WakeHint
from swactor.wire import (
    EdgeId,
    InstallRing,
    RingFault,
    RingId,
    RingInstalled,
    RingQuiesced,
    UninstallReason,
    UninstallRing,
)


class RingInstaller(Protocol):
    """The far end of a leased ring (module docstring)."""

    def install(
        self, command: InstallRing, establisher: ActorRef[Any], edge_actor: ActorRef[Any]
    ) -> None:
        """Install the ring; `RingInstalled` (or `RingFault`) goes to `establisher`."""
        ...

    def uninstall(self, ring_id: RingId, reason: UninstallReason, establisher: ActorRef[Any]
                  ) -> None:
        """Uninstall it; `RingQuiesced` (or `WorkerReaped`) goes to `establisher`."""
        ...

    def forget(self, ring_id: RingId) -> None:
        """The ring's lease is released: drop every reference to it."""
        ...

    def wake(self, hint: WakeHint) -> bool:
        """Deliver a driver wake hint to the ring's far end; False if not one of ours."""
        ...


class WorkerRingInstaller:
    """Installs rings in the GPU worker through GpuWorkerCtl."""

    def __init__(
        self, worker_ctl: ActorRef[Any], edge_routes: dict[RingId, ActorRef[Any]],
        bells: WorkerDoorbells | None = None,
    ) -> None:
        """`bells`: the doorbells GpuWorkerCtl hands its worker (module docstring)."""
        self.worker_ctl = worker_ctl
        self.edge_routes = edge_routes
        self._rings: set[int] = set()
        self.route = WorkerWakeRoute(bells, self._rings) if bells is not None else None

    def install(
        self, command: InstallRing, establisher: ActorRef[Any], edge_actor: ActorRef[Any]
    ) -> None:
        self._rings.add(int(command.ring_id))
        self.edge_routes[command.ring_id] = edge_actor
        self.worker_ctl.tell(gwc.InstallRing(command))

    def uninstall(self, ring_id: RingId, reason: UninstallReason, establisher: ActorRef[Any]
                  ) -> None:
        self.worker_ctl.tell(UninstallRing(ring_id, reason))

    def forget(self, ring_id: RingId) -> None:
        self._rings.discard(int(ring_id))
        self.edge_routes.pop(ring_id, None)

    def wake(self, hint: WakeHint) -> bool:
        if hint.ring_id not in self._rings:
            return False
        if self.route is not None:
            self.route.wake(hint)
        else:
            self.worker_ctl.tell(hint)
        return True


class LocalRingInstaller:
    """The token endpoint's end of its rings, in this process."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self._rings: dict[int, Ring] = {}
        self._by_edge: dict[int, int] = {}
        self._wakes: dict[int, asyncio.Event] = {}

    def install(
        self, command: InstallRing, establisher: ActorRef[Any], edge_actor: ActorRef[Any]
    ) -> None:
        try:
            ring = Ring.open(self.arena, command.layout)
        except RingError as exc:
            establisher.tell(
                RingFault(command.ring_id, command.edge_id, command.port_id, exc.reason)
            )
            return
        self._rings[int(command.ring_id)] = ring
        self._by_edge[int(command.edge_id)] = int(command.ring_id)
        establisher.tell(RingInstalled(command.ring_id, command.edge_id, command.port_id))

    def uninstall(self, ring_id: RingId, reason: UninstallReason, establisher: ActorRef[Any]
                  ) -> None:
        ring = self._rings.pop(int(ring_id), None)
        if ring is not None:
            ring.close()
        self._by_edge = {e: r for e, r in self._by_edge.items() if r != int(ring_id)}
        establisher.tell(RingQuiesced(ring_id))

    def forget(self, ring_id: RingId) -> None:
        self._wakes.pop(int(ring_id), None)

    def wake(self, hint: WakeHint) -> bool:
        if hint.ring_id not in self._rings:
            return False
        self.wake_event(hint.ring_id).set()
        return True

    def close(self) -> None:
        """Close every handle still installed (endpoint shutdown); the arena may then close."""
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
        self._by_edge.clear()

    # -- the token endpoint's view --------------------------------------------------------

    def ring(self, edge_id: EdgeId) -> Ring:
        """The endpoint's handle on the installed ring of `edge_id` (KeyError if none)."""
        return self._rings[self._by_edge[int(edge_id)]]

    def ring_id(self, edge_id: EdgeId) -> RingId:
        return RingId(self._by_edge[int(edge_id)])

    def wake_event(self, ring_id: int) -> asyncio.Event:
        """Set whenever the driver sends a wake hint for `ring_id`."""
        return self._wakes.setdefault(int(ring_id), asyncio.Event())


class WakeFanout:
    """The driver's `wake` callback over several installers (first owner wins)."""

    def __init__(self, *installers: RingInstaller) -> None:
        self.installers = list(installers)

    def __call__(self, hint: WakeHint) -> None:
        for installer in self.installers:
            if installer.wake(hint):
                return


__all__ = ["LocalRingInstaller", "RingInstaller", "WakeFanout", "WorkerRingInstaller"]
