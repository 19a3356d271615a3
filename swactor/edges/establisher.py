"""The node's EdgeEstablisher (spec §26, §38): per-edge records from provision to release.

Theory of operation
-------------------
One actor per node. Each provisioned edge end gets a record bound to the generated
`edge_record` machine; the record drives the edge through

    ProvisionEdge -> spawn the Tx/Rx edge actor (child) -> ArenaLease -> Granted
    -> RingInstaller.install -> RingInstalled -> EstablishSend/EstablishRecv (driver)
    -> DriverEdgeReady -> Ready (EdgeReady to the edge actor, which tells its owner)

and, on StopEdge or a fault, starts an `edge_teardown` machine that stops in the §38
order: StopEdge to the driver -> PumpStopped -> installer.uninstall -> RingQuiesced (or
GpuWorkerCtl's WorkerReaped after a crash) -> ArenaRelease with the proof minted here
-> Released -> the record's EdgeTornDown -> EdgeStopped to the edge actor (answering its
StopEdge). The tables decide; this binding routes mail to the right record and carries
out effects:

- Routing: arena answers by request id (Granted, Rejected, Cancelled) or ring id
  (Released, ReleaseRefused); worker events by ring id (RingInstalled, RingFault,
  RingQuiesced, WorkerReaped); driver events and StopEdge by edge id. Request and ring
  ids are never reused, so their mail reaches the record that used them even after a
  new record took over the edge id; it is Stopped (terminal) and absorbs it. Quiescence
  reports, PumpStopped and release answers go to the record's teardown machine while
  one runs; the record's own machine otherwise (which ignores them). Mail for an edge
  with no record is logged and dropped.
- Retirement: a record that reaches Stopped (terminal: it would only absorb what comes
  later) leaves every index at once, with its machines and its edge actor's reference.
  Edge ids are drawn per run, so keeping Stopped records kept every past run's edges for
  the life of the node (the soak's per-run node memory growth). Late mail for a retired
  record finds none and is dropped as the Stopped machine would have absorbed it; the
  last `RETIRED_KEPT` retired edge ids are remembered so `EdgeStates` still answers
  Stopped for them, and `EdgeReleases` keeps the last `RETIRED_KEPT` releases.
- Bindings: each record is the binding of both its machines (`EdgeRecordEffects` and
  `EdgeTeardownEffects`, one method per effect), each hosted by a `MachineHost`.
- Stale events: a machine's ProtocolError is logged and dropped, never a crash. A lease
  granted after cancellation reaches the record in CancellingLease / AbandoningLease,
  which releases it unused (`NeverInstalled` proof) without installing anything.
- Pump bookkeeping: a pump that ended by itself (stream fault) already sent PumpStopped
  and the driver answers no second one, so the record remembers it and StopPump is
  answered from that memory.
- Proofs: the ArenaManager's `QuiescenceMinter` lives here (the teardown path). The
  teardown's ReleaseRing carries `worker_reaped`: False mints PumpStoppedAndRingQuiesced
  (the teardown machine only gets there after PumpStopped and RingQuiesced), True mints
  WorkerReaped (GpuWorkerCtl reports WorkerReaped only after its process actor reported
  the exit, i.e. after the child was reaped; the notice does not carry the status, so -1
  stands for "collected").
- Timers: each record's and teardown's StartTimer/CancelTimer become actor timers named
  per edge; a fired timer is fed back to the machine that armed it.

Mail in: `ProvisionEdge` (ask: `EdgeProvisioned` / `EdgeRefused`), `edge_record.StopEdge`,
`EdgeStates` (ask), the arena's `Granted`/`Queued`/`Rejected`/`Cancelled`/`Released`/
`ReleaseRefused`, the worker's `RingInstalled`/`RingFault`/`RingQuiesced` and
`WorkerReaped`, the driver's `DriverEdgeReady`/`StreamFault`/`StreamClosed`/`PumpStopped`.
Mail out: `ArenaLease`/`ArenaCancel`/`ArenaRelease` to the ArenaActor, `ExpectRecv`/
`EstablishSend`/`EstablishRecv`/`StopEdge` to the DriverActor, installer calls,
`EdgeReady`/`EdgeFailed`/`EdgeStopped` to edge actors, and the `edge_ready` lifecycle event.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor import faults
from swactor.actors import Actor, ActorRef, Context
from swactor.arena import (
    Cancelled,
    Granted,
    Queued,
    QuiescenceMinter,
    Rejected,
    Released,
    ReleaseRefused,
)
from swactor.edges.arena_actor import ArenaCancel, ArenaLease, ArenaRelease
from swactor.edges.driver_actor import ExpectRecv, RouteDriverEvents
from swactor.edges.edge_actors import RxEdgeActor, TxEdgeActor
from swactor.edges.installer import RingInstaller
from swactor.edges.messages import (
    EdgeProvisioned,
    EdgeRefused,
    EdgeReleases,
    EdgeStates,
    ProvisionEdge,
)
from swactor.events import schema
from swactor.events.schema import LifecycleEvent
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import edge_teardown as et
from swactor.fsm.host import MachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.transport import messages as tm
from swactor.wire import (
    ArenaFailure,
    DriverEdgeReady,
    EdgeFailed,
    EdgeId,
    EdgeReady,
    EdgeStopped,
    InstallRing,
    LeaseRequestId,
    NodeId,
    PortId,
    ProvisionRx,
    ProvisionTx,
    QuiescenceProof,
    QuiescenceProofKind,
    RingDirection,
    RingFault,
    RingFaultReason,
    RingId,
    RingInstalled,
    RingLayout,
    RingQuiesced,
    RingSpec,
    RunFaultReason,
    StopEdge,
    StreamFault,
    StreamFaultReason,
    UninstallReason,
    WorkerReaped,
)

log = logging.getLogger("swactor.edges.establisher")

NOT_ESTABLISHED = frozenset({StreamFaultReason.HandshakeFailed,
                             StreamFaultReason.PeerNotAllowed})
"""Stream faults that mean the edge's connection was never made (spec §36 edge
establishment failure; the `never_connected` guard), not that an established stream
broke (StreamFault)."""

RETIRED_KEPT = 256
"""Retired edge ids (and releases) remembered for `EdgeStates` / `EdgeReleases`: a test or
operator asks about the edges of the last few runs (two per run on a stage node);
bounded so a long-lived node does not grow per run."""


@dataclass(frozen=True)
class EstablisherConfig:
    """Who the establisher talks to and its timings."""

    node_id: NodeId
    arena: ActorRef[Any]
    driver: ActorRef[Any]
    installer: RingInstaller
    minter: QuiescenceMinter
    lease_timeout_s: float = 30.0
    teardown_step_timeout_s: float = 10.0
    emit: Callable[[LifecycleEvent], None] | None = None


@dataclass(frozen=True, slots=True)
class _Timer:
    edge_id: int
    teardown: bool
    name: str


class _RecordTimers:
    """One machine's timers as actor timers named per edge (the module doc's Timers)."""

    def __init__(self, ctx: Context[Any], edge: int, teardown: bool) -> None:
        self._ctx = ctx
        self._edge = edge
        self._teardown = teardown

    def start(self, name: str, seconds: float, message: object) -> None:
        self._ctx.timers.start(f"{self._edge}:{self._teardown}:{name}", seconds,
                               _Timer(self._edge, self._teardown, name))

    def cancel(self, name: str) -> None:
        self._ctx.timers.cancel(f"{self._edge}:{self._teardown}:{name}")


class _Record(er.EdgeRecordEffects[None], et.EdgeTeardownEffects[None]):
    """One edge end: its two machines, the guards they ask and the effects they name."""

    def __init__(self, request: ProvisionEdge, request_id: LeaseRequestId,
                 lease_timeout_s: float, *, establisher: EdgeEstablisher,
                 ctx: Context[Any]) -> None:
        provision = request.provision
        self.est = establisher
        self.ctx = ctx
        self.edge_id = provision.edge_id
        self.provision = provision
        self.port_id: PortId = request.port_id
        self.owner = request.owner
        self.run_id = request.run_id
        self.request_id = request_id
        self.direction = (RingDirection.Egress if isinstance(provision, ProvisionTx)
                          else RingDirection.Ingress)
        self.machine = er.EdgeRecordMachine(
            self, edge_id=self.edge_id, request_id=request_id, direction=self.direction,
            lease_timeout_s=lease_timeout_s, clean=True,
        )
        self.host = MachineHost(
            self.machine, er.bind(self), timers=_RecordTimers(ctx, int(self.edge_id), False),
            timer_events=er.TIMER_EVENTS, rejected=self._rejected)
        self.teardown: et.EdgeTeardownMachine | None = None
        self.teardown_host: MachineHost[et.Event] | None = None
        self.edge_actor: ActorRef[Any] | None = None
        self.ring_id: RingId | None = None
        self.layout: RingLayout | None = None
        self.pump_stopped = False

    def _rejected(self, event: object, error: ProtocolError) -> None:
        log.warning("edge %d: %s", int(self.edge_id), error)

    # -- edge_record guards ----------------------------------------------------------

    def never_fits(self, event: er.RingLeaseRejected) -> bool:
        return event.reason is ArenaFailure.LeaseNeverFits

    def sends(self, event: er.RingInstalled) -> bool:
        return self.direction is RingDirection.Egress

    def never_connected(self, event: er.StreamFault) -> bool:
        return event.reason in NOT_ESTABLISHED

    def pump_failed(self, event: er.StreamFault) -> bool:
        return event.reason is StreamFaultReason.PumpFailed

    @property
    def tearing_down(self) -> bool:
        return self.teardown is not None and self.teardown.state in (
            et.State.StoppingPump, et.State.StoppingWorkerRing, et.State.ReleasingArena)

    # -- edge_record effects (EdgeRecordEffects) -------------------------------------

    def spawn_edge_actor(self, edge_id: EdgeId, direction: RingDirection) -> None:
        cfg, ctx, est = self.est.config, self.ctx, self.est
        me = ctx.self_ref
        est._spawned += 1
        if direction is RingDirection.Egress:
            self.edge_actor = ctx.spawn(
                lambda: TxEdgeActor(edge_id, self.owner, me),
                f"tx-edge-{int(edge_id)}-{est._spawned}")
        else:
            self.edge_actor = ctx.spawn(
                lambda: RxEdgeActor(edge_id, self.owner, me),
                f"rx-edge-{int(edge_id)}-{est._spawned}")
            assert isinstance(self.provision, ProvisionRx)
            producer = int(self.provision.tx_node_id)
            cfg.driver.tell(ExpectRecv(((int(edge_id), producer),)))

    def lease_ring(self, request_id: LeaseRequestId, edge_id: EdgeId,
                   direction: RingDirection, ring_spec: RingSpec) -> None:
        self.est.config.arena.tell(
            ArenaLease(request_id, edge_id, direction, ring_spec, self.ctx.self_ref))

    def cancel_lease(self, request_id: LeaseRequestId) -> None:
        self.est.config.arena.tell(ArenaCancel(request_id, self.ctx.self_ref))

    def release_unused_ring(self, ring_id: RingId) -> None:
        self.est._by_ring[int(ring_id)] = self
        self.est._release(ring_id, self.est.config.minter.never_installed(int(ring_id)))

    def install_ring(self, ring_id: RingId, edge_id: EdgeId, direction: RingDirection,
                     layout: RingLayout) -> None:
        self.ring_id, self.layout = ring_id, layout
        self.est._by_ring[int(ring_id)] = self
        assert self.edge_actor is not None
        command = InstallRing(ring_id, edge_id, self.port_id, direction, layout,
                              self.provision.object_spec)
        self.est.config.installer.install(command, self.ctx.self_ref, self.edge_actor)

    def establish_send(self, edge_id: EdgeId, ring_id: RingId) -> None:
        assert self.layout is not None and isinstance(self.provision, ProvisionTx)
        self.est.config.driver.tell(tm.EstablishSend(
            int(edge_id), int(self.provision.rx_node_id), int(ring_id), self.layout))

    def establish_recv(self, edge_id: EdgeId, ring_id: RingId) -> None:
        assert self.layout is not None and isinstance(self.provision, ProvisionRx)
        self.est.config.driver.tell(tm.EstablishRecv(
            int(edge_id), int(self.provision.tx_node_id), int(ring_id), self.layout))

    def notify_edge_ready(self, edge_id: EdgeId) -> None:
        cfg = self.est.config
        assert self.ring_id is not None
        self._tell_actor(EdgeReady(edge_id, self.ring_id))
        if cfg.emit is not None and self.run_id is not None:
            cfg.emit(schema.EdgeReady(node_id=cfg.node_id, run_id=self.run_id,
                                      edge_id=edge_id, ring_id=self.ring_id))

    def notify_edge_failed(self, edge_id: EdgeId, reason: RunFaultReason) -> None:
        self._tell_actor(EdgeFailed(edge_id, reason))
        self._drop_held_stream()

    def notify_edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self._tell_actor(EdgeStopped(edge_id, clean))
        self._drop_held_stream()

    def start_edge_teardown(self, edge_id: EdgeId, reason: UninstallReason) -> None:
        self._start_teardown(reason, et.StopEdge(edge_id))

    def start_teardown_on_stream_fault(self, edge_id: EdgeId, reason: StreamFaultReason,
                                       uninstall: UninstallReason) -> None:
        self._start_teardown(uninstall, StreamFault(edge_id, reason))

    def start_teardown_on_ring_fault(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                                     reason: RingFaultReason,
                                     uninstall: UninstallReason) -> None:
        self._start_teardown(uninstall, et.RingFault(ring_id, edge_id, port_id, reason))

    def _start_teardown(self, reason: UninstallReason, first: et.Event) -> None:
        """A new edge_teardown machine, fed the event that stopped the record (§38)."""
        assert self.ring_id is not None, "teardown starts only after a lease"
        self.teardown = et.EdgeTeardownMachine(
            self, edge_id=self.edge_id, ring_id=self.ring_id, reason=reason,
            step_timeout_s=self.est.config.teardown_step_timeout_s,
        )
        self.teardown_host = MachineHost(
            self.teardown, et.bind(self), timers=_RecordTimers(self.ctx, int(self.edge_id), True),
            timer_events=et.TIMER_EVENTS, rejected=self._rejected)
        self.teardown_host.feed(first)

    # -- edge_teardown effects (EdgeTeardownEffects) ---------------------------------

    def stop_pump(self, edge_id: EdgeId) -> None:
        if self.pump_stopped:  # ended by itself; the driver answers no second time
            self.ctx.self_ref.tell(tm.PumpStopped(int(edge_id), None))
        else:
            self.est.config.driver.tell(StopEdge(edge_id))

    def uninstall_ring(self, ring_id: RingId, reason: UninstallReason) -> None:
        self.est.config.installer.uninstall(ring_id, reason, self.ctx.self_ref)

    def release_ring(self, ring_id: RingId, worker_reaped: bool) -> None:
        minter = self.est.config.minter
        proof = (minter.worker_reaped(int(ring_id), -1) if worker_reaped else
                 minter.after_teardown(int(ring_id), pump_stopped=True, ring_quiesced=True))
        self.est._release(ring_id, proof)

    def edge_torn_down(self, edge_id: EdgeId, clean: bool) -> None:
        if self.ring_id is not None:
            self.est.config.installer.forget(self.ring_id)
        self.est._to_record(self, er.EdgeTornDown(edge_id, clean))

    # -- helpers ---------------------------------------------------------------------

    def _drop_held_stream(self) -> None:
        """An Rx record that ends before any ring was installed (no teardown will run)
        never sent EstablishRecv, but the driver may hold its early stream (ExpectRecv):
        have the driver stop it. Its PumpStopped finds no teardown and changes nothing."""
        if self.direction is RingDirection.Ingress and self.ring_id is None:
            self.est.config.driver.tell(StopEdge(self.edge_id))

    def _tell_actor(self, message: object) -> None:
        if self.edge_actor is not None:
            self.edge_actor.tell(message)


class EdgeEstablisher(Actor[Any]):
    """The node's EdgeEstablisher (module docstring)."""

    def __init__(self, config: EstablisherConfig) -> None:
        self.config = config
        self.records: dict[int, _Record] = {}
        self._by_request: dict[int, _Record] = {}
        self._by_ring: dict[int, _Record] = {}
        self._next_request = 1
        self._spawned = 0
        self.releases: deque[tuple[int, QuiescenceProofKind]] = deque(maxlen=RETIRED_KEPT)
        self._retired: OrderedDict[int, None] = OrderedDict()
        """Edge ids whose record reached Stopped and was dropped (module doc)."""
        self._ctx: Context[Any] | None = None

    async def started(self, ctx: Context[Any]) -> None:
        self._ctx = ctx
        self.config.driver.tell(RouteDriverEvents(ctx.self_ref))

    # -- mail -----------------------------------------------------------------------

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        match message:
            case ProvisionEdge():
                ctx.reply(self._provision(ctx, message))
            case EdgeStates():
                states = dict.fromkeys(self._retired, er.State.Stopped)
                states.update({edge: rec.machine.state for edge, rec in self.records.items()})
                ctx.reply(states)
            case EdgeReleases():
                ctx.reply(list(self.releases))
            case StopEdge(edge_id=edge):
                self._to_record(self.records.get(int(edge)), message)
            case Granted(request_id=request, layout=layout):
                self._to_record(self._request(request),
                                er.RingLeased(request, layout.ring_id, layout))
            case Rejected(request_id=request, reason=reason):
                self._to_record(self._request(request), er.RingLeaseRejected(request, reason))
            case Cancelled(request_id=request):
                self._to_record(self._request(request), er.LeaseCancelled(request))
            case Queued():
                pass  # WaitingForLease's timer already runs (§35 arena pressure)
            case Released(ring_id=ring):
                self._release_answer(ring, et.RingReleased(ring), er.RingReleased(ring))
            case ReleaseRefused(ring_id=ring):
                self._release_answer(ring, et.ReleaseRejected(ring), er.ReleaseRejected(ring))
            case RingInstalled(ring_id=ring, edge_id=edge, port_id=port):
                self._to_record(self._ring(ring), er.RingInstalled(ring, edge, port))
            case RingFault(ring_id=ring):
                self._to_record(self._ring(ring), message)
            case RingQuiesced(ring_id=ring) | WorkerReaped(ring_id=ring):
                self._to_teardown(self._ring(ring), message)
            case DriverEdgeReady(edge_id=edge):
                self._to_record(self.records.get(edge), message)
            case StreamFault(edge_id=edge):
                self._to_record(self.records.get(edge), message)
            case tm.StreamRefused(edge_id=edge, reason=reason, detail=detail):
                log.warning("stream refused (edge %s): %s %s", edge, reason.value, detail)
            case tm.StreamClosed(edge_id=edge):
                self._to_record(self.records.get(edge), er.StreamClosed(EdgeId(edge)))
            case tm.PumpStopped(edge_id=edge):
                rec = self.records.get(edge)
                if rec is not None:
                    rec.pump_stopped = True
                    self._to_teardown(rec, et.PumpStopped(EdgeId(edge)))
            case _Timer(edge_id=edge, teardown=teardown, name=name):
                rec = self.records.get(edge)
                if teardown:
                    self._to_teardown(rec, et.TIMER_EVENTS[name]())
                else:
                    self._to_record(rec, er.TIMER_EVENTS[name]())
            case _:
                log.debug("establisher: ignoring %s", type(message).__name__)

    def _request(self, request_id: LeaseRequestId) -> _Record | None:
        return self._by_request.get(int(request_id))

    def _ring(self, ring_id: RingId) -> _Record | None:
        return self._by_ring.get(int(ring_id))

    def _release_answer(self, ring: RingId, teardown_event: Any,
                        record_event: Any) -> None:
        rec = self._ring(ring)
        if rec is not None and rec.tearing_down and rec.ring_id == ring:
            self._to_teardown(rec, teardown_event)
        else:
            self._to_record(rec, record_event)

    # -- provisioning ---------------------------------------------------------------

    def _provision(self, ctx: Context[Any], request: ProvisionEdge
                   ) -> EdgeProvisioned | EdgeRefused:
        provision = request.provision
        edge = int(provision.edge_id)
        old = self.records.get(edge)
        if old is not None and old.machine.state is not er.State.Stopped:
            return EdgeRefused(provision.edge_id, f"edge {edge} already has a live record")
        want = (RingDirection.Egress if isinstance(provision, ProvisionTx)
                else RingDirection.Ingress)
        if provision.ring_spec.direction is not want:
            return EdgeRefused(provision.edge_id,
                               f"ring_spec.direction must be {want.value} for this end")
        request_id = LeaseRequestId(self._next_request)
        self._next_request += 1
        # SWACTOR_FAULT_INJECT arena.pressure may shorten the lease timer (swactor/faults)
        rec = _Record(request, request_id, faults.lease_timeout_s(self.config.lease_timeout_s),
                      establisher=self, ctx=ctx)
        self.records[edge] = rec
        self._retired.pop(edge, None)
        self._by_request[int(request_id)] = rec
        event: er.Event
        if isinstance(provision, ProvisionTx):
            event = er.ProvisionTx(provision.edge_id, provision.rx_node_id,
                                   provision.object_spec, provision.ring_spec)
        else:
            assert isinstance(provision, ProvisionRx)
            event = er.ProvisionRx(provision.edge_id, provision.tx_node_id,
                                   provision.object_spec, provision.ring_spec)
        self._to_record(rec, event)
        assert rec.edge_actor is not None
        return EdgeProvisioned(provision.edge_id, rec.edge_actor)

    # -- machines -------------------------------------------------------------------

    def _to_record(self, rec: _Record | None, event: er.Event) -> None:
        if rec is None:
            log.info("establisher: %s for an edge with no record; dropped", type(event).__name__)
            return
        rec.host.feed(event)
        if rec.machine.state is er.State.Stopped:
            self._retire(rec)

    def _retire(self, rec: _Record) -> None:
        """Drop a Stopped record from every index; remember its edge id (module doc)."""
        edge = int(rec.edge_id)
        if self.records.get(edge) is rec:
            del self.records[edge]
            self._retired[edge] = None
            while len(self._retired) > RETIRED_KEPT:
                self._retired.popitem(last=False)
        self._by_request = {k: r for k, r in self._by_request.items() if r is not rec}
        self._by_ring = {k: r for k, r in self._by_ring.items() if r is not rec}

    def _to_teardown(self, rec: _Record | None, event: et.Event) -> None:
        if rec is None or rec.teardown_host is None:
            return  # no teardown running: quiescence and pump reports change nothing
        rec.teardown_host.feed(event)

    def _release(self, ring: RingId, proof: QuiescenceProof) -> None:
        self.releases.append((int(ring), proof.kind))
        assert self._ctx is not None
        self.config.arena.tell(ArenaRelease(ring, proof, self._ctx.self_ref))
