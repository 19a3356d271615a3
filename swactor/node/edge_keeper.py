"""The node's edge ends: ring leases, worker ring installs and driver pumps per stage edge.

Theory of operation. `EdgeKeeper` is the node actor that turns the StageController's
`establish_inbound` / `establish_outbound` / `stop_edges` ports into real edge ends, in
the EdgeEstablisher's place (spec §24-§27) until that component lands:

establish (one edge)
    lease a ring in the node's memfd arena (`FreeList`: one 4 KiB header page, then the
    data region; `Ring.init` writes a fresh header), send GpuWorkerCtl `InstallRing`
    (ingress for the inbound edge, egress for the outbound one). On the worker's
    `RingInstalled` the driver gets `EstablishRecv` / `EstablishSend` (to the consumer
    node of the provision); the driver's `DriverEdgeReady` becomes
    `EdgeEstablished(edge, ring)` to the stage.
stop (both edges)
    `StopEdge` to the driver and `UninstallRing` to GpuWorkerCtl; when the driver's
    `PumpStopped` and the worker's `RingQuiesced` are both in, the lease goes back to
    the free list and the stage gets `EdgeStopped(edge, clean)` (clean: no fault was
    seen on the edge). An edge that was never established stops clean at once.
faults
    a driver `StreamFault` or a worker `RingFault` on a live edge becomes the stage's
    `EdgeFault` (StreamFault / RingFault reason). A `PeerReset` is the exception: the
    other end stopped the edge on purpose, which happens only when its node (or the
    orchestrator) tears the run down; teardown messages race across nodes, so it is
    logged, not a fault (a peer that fails reports its own fault).
wake hints
    the driver's `RingReadable` (it wrote an ingress ring) / `RingWritable` (it read an
    egress ring) go to GpuWorkerCtl, the worker's `RingReadable` / `RingWritable` (it
    wrote an egress ring / read an ingress ring) go to the driver.

Driver callbacks run on the event loop outside this actor, so the keeper turns them into
its own mail (`driver_event`, `driver_wake`). `live_leases()` is the leak check: after a
run it must be empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swactor import faults
from swactor.actors import Actor, ActorRef, Context
from swactor.arena import Arena
from swactor.arena.allocator import FreeList, align_up
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_ports import EdgeEstablished
from swactor.node.worker_ctl import WorkerReaped
from swactor.ring import Ring
from swactor.transport import Driver
from swactor.transport.messages import (
    DriverEdgeReady,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamClosed,
    StreamFault,
)
from swactor.transport.messages import RingReadable as DriverReadable
from swactor.transport.messages import RingWritable as DriverWritable
from swactor.wire import (
    Component,
    EdgeId,
    InstallRing,
    NodeId,
    ObjectSpec,
    PortId,
    ProvisionStage,
    RingDirection,
    RingFault,
    RingId,
    RingInstalled,
    RingLayout,
    RingQuiesced,
    RingReadable,
    RingSpec,
    RingWritable,
    RunFaultReason,
    StreamFaultReason,
    UninstallReason,
)

log = logging.getLogger("swactor.node.edges")

HEADER_PAGE = 4096


@dataclass(frozen=True, slots=True)
class EstablishEdge:
    """Set up one edge end of a provisioned stage (from the stage ports)."""

    provision: ProvisionStage
    inbound: bool


@dataclass(frozen=True, slots=True)
class StopEdges:
    """Tear down the stage's edge ends (from the stage ports)."""

    edge_ids: tuple[EdgeId, ...]


@dataclass(frozen=True, slots=True)
class _DriverMail:
    event: object


@dataclass
class EdgeEnd:
    """One leased ring and what is known of its edge."""

    edge_id: EdgeId
    ring: Ring
    layout: RingLayout
    direction: RingDirection
    consumer: NodeId | None
    lease: tuple[int, int]
    installed: bool = False
    ready: bool = False
    stopping: bool = False
    pump_stopped: bool = False
    quiesced: bool = False
    faulted: bool = False
    notes: list[str] = field(default_factory=list)


KeeperMail = EstablishEdge | StopEdges | _DriverMail | RingInstalled | RingQuiesced | RingFault


class EdgeKeeper(Actor[Any]):
    """Edge ends of the node's stage (module doc)."""

    def __init__(self, arena: Arena, stage: ActorRef[Any]) -> None:
        self.arena = arena
        self.stage = stage
        self.driver: Driver | None = None
        self.worker: ActorRef[Any] | None = None
        self.free = FreeList(arena.size)
        self.ends: dict[EdgeId, EdgeEnd] = {}
        self._by_ring: dict[int, EdgeEnd] = {}
        self._next_ring = 1
        self._self: ActorRef[Any] | None = None

    def bind(self, driver: Driver, worker: ActorRef[Any]) -> None:
        self.driver, self.worker = driver, worker

    def live_leases(self) -> list[tuple[int, int]]:
        """(edge id, ring id) of every ring still leased."""
        return [(int(end.edge_id), int(end.layout.ring_id)) for end in self.ends.values()]

    # -- callbacks for the driver (outside the actor) -----------------------------------

    def driver_callbacks(
        self, ref: ActorRef[Any]
    ) -> tuple[Callable[[object], None], Callable[[object], None]]:
        """(emit, wake) for `Driver(...)`: events become mail, wake hints go to the worker."""

        def emit(event: object) -> None:
            ref.tell(_DriverMail(event))

        def wake(hint: object) -> None:
            worker = self.worker
            if worker is None:
                return
            if isinstance(hint, DriverReadable):
                worker.tell(gwc.RingReadable(RingId(hint.ring_id)))
            elif isinstance(hint, DriverWritable):
                worker.tell(gwc.RingWritable(RingId(hint.ring_id)))

        return emit, wake

    # -- mail ---------------------------------------------------------------------------

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        match message:
            case EstablishEdge():
                self._establish(message.provision, message.inbound)
            case StopEdges():
                for edge in message.edge_ids:
                    self._stop(edge)
            case RingInstalled():
                self._installed(message.ring_id)
            case RingQuiesced() | WorkerReaped():
                end = self._by_ring.get(int(message.ring_id))
                if end is not None:
                    end.quiesced = True
                    self._maybe_release(end)
            case RingFault():
                self._fault(self._by_ring.get(int(message.ring_id)), RunFaultReason.RingFault,
                            Component.Worker)
            case RingReadable() if self.driver is not None:
                self.driver.ring_readable(int(message.ring_id))
            case RingWritable() if self.driver is not None:
                self.driver.ring_writable(int(message.ring_id))
            case _DriverMail(event=event):
                self._driver_event(event)
            case _:
                pass

    def _establish(self, provision: ProvisionStage, inbound: bool) -> None:
        edge_plan = provision.inbound if inbound else provision.outbound
        edge = edge_plan.edge_id
        if edge in self.ends:
            log.warning("edge %d: establish twice, ignored", int(edge))
            return
        spec: RingSpec = edge_plan.ring_spec
        object_spec: ObjectSpec = edge_plan.object_spec
        alignment = max(spec.alignment, HEADER_PAGE)
        capacity = align_up(spec.data_capacity, alignment)
        if faults.hit("node.ring_oversize"):  # SWACTOR_FAULT_INJECT (swactor/faults)
            capacity = align_up(self.arena.size, alignment)
        size = HEADER_PAGE + capacity
        offset = self.free.find(size, alignment, skew=HEADER_PAGE)
        if offset is None:
            log.error("edge %d: no room for a %d-byte ring", int(edge), size)
            self.stage.tell(scm.EdgeFault(edge, RunFaultReason.RingRequestOversized,
                                          Component.ArenaManager))
            return
        self.free.take(offset, size)
        ring_id = RingId(self._next_ring)
        self._next_ring += 1
        layout = RingLayout(ring_id=ring_id, arena_offset=offset, total_len=size,
                            header_offset=offset, data_offset=offset + HEADER_PAGE,
                            data_capacity=capacity, alignment=spec.alignment)
        direction = RingDirection.Ingress if inbound else RingDirection.Egress
        consumer = None if inbound else provision.outbound.consumer_node_id
        end = EdgeEnd(edge, Ring.init(self.arena, layout), layout, direction, consumer,
                      (offset, size))
        self.ends[edge] = end
        self._by_ring[int(ring_id)] = end
        port: PortId = provision.runtime.input_port if inbound else provision.runtime.output_port
        assert self.worker is not None
        self.worker.tell(gwc.InstallRing(InstallRing(ring_id, edge, port, direction, layout,
                                                     object_spec)))

    def _installed(self, ring_id: RingId) -> None:
        end = self._by_ring.get(int(ring_id))
        if end is None or end.stopping:
            return
        end.installed = True
        driver = self.driver
        assert driver is not None
        ring = int(ring_id)
        if end.direction is RingDirection.Ingress:
            driver.handle(EstablishRecv(int(end.edge_id), ring, end.layout))
        else:
            assert end.consumer is not None
            driver.handle(EstablishSend(int(end.edge_id), int(end.consumer), ring, end.layout))

    def _driver_event(self, event: object) -> None:
        edge_id = getattr(event, "edge_id", None)
        end = self.ends.get(EdgeId(edge_id)) if edge_id is not None else None
        match event:
            case DriverEdgeReady() if end is not None and not end.ready:
                end.ready = True
                self.stage.tell(EdgeEstablished(end.edge_id, end.layout.ring_id))
            case PumpStopped() if end is not None:
                end.pump_stopped = True
                self._maybe_release(end)
            case StreamFault(reason=StreamFaultReason.PeerReset):
                # the other end stopped the edge: its node (or the orchestrator) is
                # tearing the run down, which is not a fault of this edge
                log.info("edge %s: peer stopped the stream (%s)", edge_id, event.detail)
            case StreamFault():
                log.warning("edge %s: stream fault %s %s", edge_id, event.reason.value,
                            event.detail)
                self._fault(end, RunFaultReason.StreamFault, Component.Driver)
            case StreamClosed():
                pass
            case _:
                pass

    def _fault(self, end: EdgeEnd | None, reason: RunFaultReason, component: Component) -> None:
        if end is None or end.stopping or end.faulted:
            if end is not None:
                end.faulted = True
            return
        end.faulted = True
        self.stage.tell(scm.EdgeFault(end.edge_id, reason, component))

    def _stop(self, edge: EdgeId) -> None:
        end = self.ends.get(edge)
        if end is None:
            self.stage.tell(scm.EdgeStopped(edge, True))
            return
        if end.stopping:
            return
        end.stopping = True
        assert self.driver is not None and self.worker is not None
        self.driver.handle(StopEdge(int(edge)))
        # an InstallRing still in flight is ignored when its RingInstalled comes back;
        # GpuWorkerCtl answers UninstallRing for a ring it does not hold with WorkerReaped
        self.worker.tell(gwc.UninstallRing(end.layout.ring_id, UninstallReason.EdgeStopped))

    def _maybe_release(self, end: EdgeEnd) -> None:
        if not (end.stopping and end.pump_stopped and end.quiesced):
            return
        end.ring.close()
        self.free.give(*end.lease)
        del self.ends[end.edge_id]
        del self._by_ring[int(end.layout.ring_id)]
        self.stage.tell(scm.EdgeStopped(end.edge_id, not end.faulted))
