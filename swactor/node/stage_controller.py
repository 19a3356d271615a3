"""The node's StageController actor: the generated stage_controller machine bound to `StagePorts`.

Theory of operation. `StageController` is an actor (`swactor.actors`) that owns one
`StageControllerMachine` (spec §14, §15, §36, §38) for one provisioning of this node,
plus the bookkeeping its guards read. One controller lives for one run: the node's
`StageHost` (`stage_host.py`) spawns a fresh controller for each accepted run and
forgets it once it reports StageStopped, so no per-run state can leak into the next run.

Mail is the machine's events (ProvisionStage and StopRun from the control channel,
WeightsReady/WeightsFailed from the weight loader, EdgeFault/EdgeStopped from the edge
actors, StoppingTimeout from its own timer) plus what other node actors send as they
are: GpuWorkerCtl's §30 worker events (`wire.ObjectLoaded`, `wire.ObjectProduced`,
`wire.ObjectFailed`, `wire.RoleConfigured`, `wire.RoleFailed`, `wire.StepCompleted`,
`wire.StepFailed`) and its `WorkerCrashed` notice, the edge actors'
`EdgeReady(edge_id, ring_id)` and the loader's `WeightsFetched` progress. For every
message the binding

1. translates it into the machine event it stands for, keeping what the machine does
   not carry (the outbound ring id): worker mail for another role, edge or step than
   this stage's is logged and dropped, an ObjectFailed on one of this stage's edges
   becomes EdgeFault with its §36 reason, and an ObjectLoaded / ObjectProduced line is
   dropped (a granted step reports its objects in its StepCompleted; the table doc
   says why an ObjectLoaded can still come);
2. updates its bookkeeping so the guards are plain reads: `provision_valid` (the sender
   is the trusted orchestrator, the run is the node's active run and not one it already
   ran, and the last stage's tokens go back to that orchestrator), `setup_complete`
   (role configured, weights ready, both edges ready), `teardown_pending` /
   `teardown_clean` (both edges stopped / none unclean, no port failed);
3. feeds the event to its `AsyncMachineHost` (`swactor.fsm.host`), which runs the
   machine's timer on `ctx.timers` and awaits the binding's method for each effect in
   order (the class implements `StageControllerEffects`). The four setup
   effects of Preparing start port tasks (they may take long: a download), so the actor
   stays responsive to StopRun; the others are awaited inline and must only queue a
   command. IssueGrant sends the standing step grant (the table doc says why): step
   ids from this run's range, the input awaited as "sequence k on the inbound ring" on
   the role's input port from sequence 0, the output on the outbound ring with the
   *same* sequence and object id `sequence + 1`, an extent per input row (rows of
   `hidden * width` out; one token id out of the last stage). RecordStep emits a
   reported step's four events, stamped with the worker's times (its object_loaded no
   earlier than the previous step's step_completed, so the log stays in step order
   when an object was loaded while the step before it ran). RevokeGrant sends
   RevokeSteps; the worker frees the objects the grant did not run, so this stage holds
   no device object.

A port that raises is turned into the event its outcome would have been (module doc of
`stage_ports`), posted to the actor's own mailbox, never fed re-entrantly. Events the
machine refuses in its state (`unhandled: raise`) come from other actors, so they are
logged and listed in `StageOutcome.rejected_events`, never allowed to crash the stage.

Lifecycle events (spec §40) go through `ports.emit`, in this order for a clean run:
weights_download_started, edge_provision_started (inbound, outbound), then as they come
weights_downloaded, edge_ready (per edge), weights_loaded (weights ready and role
configured), stage_ready; per step object_loaded, execute_step_started,
object_produced, step_completed (emitted together, in one `emit_all`, when the step's
StepCompleted comes, stamped with the worker's times); stage_stopped. Faults are
reported to the orchestrator (StageFault with reason and component), which emits
run_faulted.

Once the machine is Stopped the `finished` future resolves with the `StageOutcome` and
the actor stops itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swactor import wire
from swactor.actors import Actor, Context
from swactor.events import schema
from swactor.events.schema import (
    EdgeProvisionStarted,
    ExecuteStepStarted,
    ObjectLoaded,
    ObjectProduced,
    StageReady,
    StageStopped,
    StepCompleted,
    WeightsDownloaded,
    WeightsDownloadStarted,
    WeightsLoaded,
)
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.fsm.host import AsyncMachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.node.stage_ports import (
    StageFaultRecord,
    StageOutcome,
    StagePorts,
    StageReport,
    WeightsFetched,
)
from swactor.node.worker_ctl import WorkerCrashed as WorkerCrashedNotice
from swactor.wire import (
    OBJECT_FAULTS,
    AwaitedInput,
    Component,
    EdgeId,
    EdgeKind,
    NodeId,
    ObjectId,
    OutputBinding,
    PortId,
    ProvisionStage,
    RingId,
    RoleFailure,
    RunFaultError,
    RunFaultReason,
    RunId,
    Sequence,
    StageIndex,
    StepFailure,
    StepId,
    StepRecord,
)

log = logging.getLogger("swactor.node.stage_controller")

DEFAULT_STOPPING_GRACE_S = 30.0
STEP_IDS_PER_RUN = 1 << 32
"""Each run's controller mints step ids from its own range of this size (StepId is u64)."""

WorkerMail = (
    wire.ObjectLoaded
    | wire.ObjectProduced
    | wire.ObjectFailed
    | wire.RoleConfigured
    | wire.RoleFailed
    | wire.StepCompleted
    | wire.StepFailed
    | WorkerCrashedNotice
)
StageMail = scm.Event | WorkerMail | WeightsFetched
"""Everything a StageController takes (module doc)."""

WEIGHT_REASONS = frozenset({
    RunFaultReason.WeightDownloadFailed,
    RunFaultReason.WeightLoadFailed,
    RunFaultReason.WeightBindFailed,
})
_WORKER_GONE = frozenset({RunFaultReason.WorkerCrashed, RunFaultReason.WorkerFatal})


@dataclass(frozen=True, slots=True)
class StageControllerConfig:
    """Who this node is, whom it trusts, and which runs it may accept."""

    node_id: NodeId
    orchestrator: NodeId
    """The trusted orchestrator node id (spec §4): the only valid provisioning sender."""
    active_run: RunId | None = None
    """The run this node was told to serve; None accepts any run not in `retired_runs`."""
    retired_runs: frozenset[RunId] = frozenset()
    """Runs this node already served: provisioning them again is rejected."""
    stopping_grace_s: float = DEFAULT_STOPPING_GRACE_S
    first_step_id: int = 1
    """Step ids are minted from here up (`STEP_IDS_PER_RUN` of them); the StageHost gives
    each run its own range, so a late worker answer about an earlier run's step can never
    match this run's step."""


@dataclass(slots=True)
class _Teardown:
    """Bookkeeping of Stopping: which edges stopped, how cleanly, what failed."""

    edges_stopped: set[EdgeId] = field(default_factory=set)
    unclean: list[str] = field(default_factory=list)


class StageController(Actor[StageMail], scm.StageControllerEffects[Awaitable[None]]):
    """One stage of one run: the stage_controller machine, its guards and effects."""

    def __init__(
        self,
        config: StageControllerConfig,
        ports: StagePorts,
        finished: asyncio.Future[StageOutcome],
    ) -> None:
        self.config = config
        self.ports = ports
        self.outcome = StageOutcome()
        self.machine = scm.StageControllerMachine(self, stopping_grace_s=config.stopping_grace_s)
        self._finished = finished
        self._provision: ProvisionStage | None = None
        self._claim: ProvisionStage | None = None
        self._provision_problem: str | None = None
        """What is wrong with the ProvisionStage being fed (`provision_problem`), worked out
        before the machine sees it; None when it is valid."""
        self._role_ok = False
        self._footprint: wire.StageFootprint | None = None
        """What the worker's role holds, from its RoleConfigured (StageReady carries it)."""
        self._weights_ok = False
        self._weights_fetched = False
        self._weights_loaded_emitted = False
        self._edges_ready: set[EdgeId] = set()
        self._establishing: list[asyncio.Task[None]] = []
        """The edge establishment tasks: StopEdges waits for them, so a stop that comes
        right after provisioning cannot overtake the lease an establishment takes."""
        self._rings: dict[EdgeId, RingId] = {}
        self._granted = False
        """IssueGrant sent the grant: StepCompleted / StepFailed of its steps are ours."""
        self._last_ns = 0
        """The latest stamp of a recorded step's events (RecordStep keeps them in order)."""
        self._teardown = _Teardown()
        self._ctx: Context[StageMail] | None = None
        self._host = AsyncMachineHost(self.machine, scm.bind(self),
                                      timer_events=scm.TIMER_EVENTS, rejected=self._rejected)

    # -- actor -------------------------------------------------------------------------

    async def started(self, ctx: Context[StageMail]) -> None:
        self._ctx = ctx
        self._host.timers = ctx.timers

    async def receive(self, ctx: Context[StageMail], message: StageMail) -> None:
        event = self._translate(message)
        if event is None:
            return
        self._note(event)
        await self._host.feed(event)
        if self.machine.state is scm.State.Stopped:
            self._finish(ctx)

    def _rejected(self, event: scm.Event, error: ProtocolError) -> None:
        log.warning("stage %s: %s", self._name, error)
        self.outcome.rejected_events.append(f"{error.state}: {error.event}")

    @property
    def _context(self) -> Context[StageMail]:
        assert self._ctx is not None, "effects run only once the actor started"
        return self._ctx

    async def stopped(self, ctx: Context[StageMail]) -> None:
        if not self._finished.done():
            self._finished.set_exception(RuntimeError(
                f"stage {self._name}: actor stopped in state {self.machine.state.name}"
            ))
            self._finished.exception()  # reported to whoever awaits; not logged if nobody does

    @property
    def _name(self) -> str:
        claim = self._provision or self._claim
        if claim is None:
            return "(unprovisioned)"
        return f"run {int(claim.run_id)} stage {int(claim.stage_index)}"

    # -- translation ---------------------------------------------------------------------

    def _translate(self, message: StageMail) -> scm.Event | None:
        """The machine event `message` stands for; None when it is not for this stage."""
        if isinstance(message, wire.EdgeReady):
            return self._edge_ready(message)
        if isinstance(message, WeightsFetched):
            if self.machine.state is scm.State.Preparing:
                self._emit_downloaded()
            return None
        if isinstance(message, WorkerCrashedNotice):
            if self._provision is None:
                return self._drop(message, "before provisioning")
            reason = (RunFaultReason.WorkerCrashed if message.fatal is None
                      else RunFaultReason.WorkerFatal)
            return scm.WorkerCrashed(message.generation, reason)
        if isinstance(message, scm.StopRun) and not self._for_this_run(message.run_id):
            return self._drop(message, f"StopRun for run {int(message.run_id)}")
        if isinstance(message, scm.Event) and not isinstance(message, wire.StepCompleted):
            return message
        return self._worker_event(message)  # StepCompleted too: its role and step first

    def _worker_event(self, message: WorkerMail) -> scm.Event | None:
        provision = self._provision
        if provision is None:
            return self._drop(message, "before provisioning")
        role = provision.runtime.role_id
        match message:
            case wire.ObjectLoaded() | wire.ObjectProduced() if message.edge_id in self._edges:
                return None  # the grant's objects: its steps report them (module doc)
            case wire.ObjectFailed(edge_id=edge, reason=reason) if edge in self._edges:
                component = (Component.IngressParser if edge == provision.inbound.edge_id
                             else Component.EgressProducer)
                return scm.EdgeFault(edge, OBJECT_FAULTS[reason], component)
            case wire.RoleConfigured(role_id=r) if r == role:
                self._footprint = message.footprint
                return scm.RoleConfigured(r)
            case wire.RoleFailed(role_id=r, reason=reason) if r == role:
                log.warning("stage %s: role %d failed: %s", self._name, int(r), reason.value)
                return scm.RoleFailed(r, reason)
            case wire.StepCompleted(role_id=r, step_id=s) if r == role and self._is_step(s):
                return message  # the table's StepCompleted (swactor.wire)
            case wire.StepFailed(role_id=r, step_id=s, reason=reason) if (
                r == role and self._is_step(s)
            ):
                log.warning("stage %s: step %d failed: %s", self._name, int(s), reason.value)
                return scm.StepFailed(r, s, reason)
        return self._drop(message, "not for this stage")

    def _drop(self, message: object, why: str) -> scm.Event | None:
        """Log mail that is not for this stage; always None (`return self._drop(...)`)."""
        log.info("stage %s: dropped %s (%s)", self._name, type(message).__name__, why)
        return None

    def _for_this_run(self, run: RunId) -> bool:
        claim = self._provision or self._claim
        return claim is None or claim.run_id == run

    def _is_step(self, step: StepId) -> bool:
        """A step of this run's grant (this controller's step id range, StageHost)."""
        first = self.config.first_step_id
        return self._granted and first <= step < first + STEP_IDS_PER_RUN

    @property
    def _edges(self) -> tuple[EdgeId, ...]:
        provision = self._provision
        if provision is None:
            return ()
        return (provision.inbound.edge_id, provision.outbound.edge_id)

    def _edge_ready(self, message: wire.EdgeReady) -> scm.Event | None:
        edge, ring = message.edge_id, message.ring_id
        provision = self._provision
        if provision is None or edge not in self._edges:
            return self._drop(message, f"edge {int(edge)} is not ours")
        if edge not in self._rings:
            self._rings[edge] = ring
            self.ports.emit(schema.EdgeReady(
                node_id=self.config.node_id, run_id=provision.run_id, edge_id=edge,
                ring_id=ring,
            ))
        return message  # the table's EdgeReady (swactor.wire)

    # -- bookkeeping ---------------------------------------------------------------------

    def _note(self, event: scm.Event) -> None:
        match event:
            case scm.ProvisionStage(orchestrator=sender, provision=provision):
                self._provision_problem = provision_problem(self.config, sender, provision)
                if self._claim is None:
                    self._claim = provision
            case scm.RoleConfigured():
                self._role_ok = True
                self._maybe_weights_loaded()
            case scm.WeightsReady():
                if self.machine.state is scm.State.Preparing:
                    self._emit_downloaded()
                self._weights_ok = True
                self._maybe_weights_loaded()
            case scm.EdgeReady(edge_id=edge) if edge in self._edges:
                self._edges_ready.add(edge)
            case scm.EdgeStopped(edge_id=edge, clean=clean):
                self._teardown.edges_stopped.add(edge)
                if not clean:
                    self._teardown.unclean.append(f"edge {int(edge)} stopped unclean")
            case _:
                pass

    def _maybe_weights_loaded(self) -> None:
        provision = self._provision
        if (provision is None or self._weights_loaded_emitted or not self._role_ok
                or not self._weights_ok or self.machine.state is not scm.State.Preparing):
            return
        self._weights_loaded_emitted = True
        self.ports.emit(WeightsLoaded(
            node_id=self.config.node_id, run_id=provision.run_id,
            stage_index=provision.stage_index,
            worker_generation=self.ports.worker_generation(),
        ))

    def _emit_downloaded(self) -> None:
        provision = self._provision
        if provision is None or self._weights_fetched:
            return
        self._weights_fetched = True
        self.ports.emit(WeightsDownloaded(
            node_id=self.config.node_id, run_id=provision.run_id,
            stage_index=provision.stage_index,
        ))

    # -- guards (StageControllerGuards) --------------------------------------------------

    def provision_valid(self, event: scm.ProvisionStage) -> bool:
        return self._provision_problem is None

    def setup_complete(
        self, event: scm.RoleConfigured | scm.WeightsReady | scm.EdgeReady
    ) -> bool:
        return (self._role_ok and self._weights_ok
                and self._edges_ready.issuperset(self._edges))

    def teardown_pending(self, event: scm.EdgeStopped) -> bool:
        return not self._teardown.edges_stopped.issuperset(self._edges)

    def teardown_clean(self, event: scm.EdgeStopped) -> bool:
        return not self._teardown.unclean

    # -- effects -------------------------------------------------------------------------

    # One coroutine per effect, awaited in turn: the four setup effects of Preparing
    # start port tasks; the others must only queue a command.

    async def reject_provision(self, orchestrator: NodeId, provision: ProvisionStage,
                               already_provisioned: bool) -> None:
        problem = (f"run {int(provision.run_id)} stage {int(provision.stage_index)}: "
                   "this controller is already provisioned") if already_provisioned else (
                       self._provision_problem)
        if problem is not None:
            self.outcome.rejected_provisions.append(problem)
            log.warning("stage: ProvisionStage rejected: %s", problem)
        fault = orun.StageFault(
            provision.stage_index, RunFaultReason.ProvisioningRejected, Component.StageController
        )
        await self._send(orchestrator, provision.run_id, fault)

    async def configure_worker_role(self, provision: ProvisionStage) -> None:
        self._accept(provision)
        role = provision.runtime.role_id
        self._start(self._context, self.ports.configure_role(provision),
                    lambda e: scm.RoleFailed(role, _role_failure(e)))

    async def start_weight_load(self, provision: ProvisionStage) -> None:
        self.ports.emit(WeightsDownloadStarted(
            node_id=self.config.node_id, run_id=provision.run_id,
            stage_index=provision.stage_index,
        ))
        self._start(self._context, self.ports.load_weights(provision),
                    lambda e: scm.WeightsFailed(_weights_reason(e)))

    async def establish_inbound_edge(self, provision: ProvisionStage) -> None:
        self._establish(self._context, provision.inbound.edge_id,
                        self.ports.establish_inbound(provision))

    async def establish_outbound_edge(self, provision: ProvisionStage) -> None:
        self._establish(self._context, provision.outbound.edge_id,
                        self.ports.establish_outbound(provision))

    async def report_stage_ready(self) -> None:
        self._stage_ready()
        await self._report(orun.StageReady(self._stage_index), self._footprint)

    async def issue_grant(self) -> None:
        await self._grant(self._context)

    async def record_step(self, step_id: StepId, record: StepRecord) -> None:
        self._record(step_id, record)

    async def revoke_grant(self) -> None:
        provision = self._provision
        assert provision is not None
        try:
            await self.ports.revoke_steps(provision.runtime.role_id)
        except Exception as error:  # faulted or stopping already: nothing waits on it
            log.warning("stage %s: revoke_steps failed: %s", self._name, error)

    async def report_stage_fault(self, reason: RunFaultReason, component: Component) -> None:
        if self.outcome.fault is None:
            self.outcome.fault = StageFaultRecord(reason, component)
        await self._report(orun.StageFault(self._stage_index, reason, component))

    async def stop_edges(self) -> None:
        await self._stop_edges(self._context)

    async def reset_role(self) -> None:
        await self._reset_role()

    async def report_stage_stopped(self, clean: bool) -> None:
        await self._stage_stopped(clean)

    @property
    def _stage_index(self) -> StageIndex:
        claim = self._provision or self._claim
        assert claim is not None, "a report names a stage only after a ProvisionStage"
        return claim.stage_index

    def _accept(self, provision: ProvisionStage) -> None:
        self._provision = provision
        self.outcome.run_id = provision.run_id
        self.outcome.stage_index = provision.stage_index
        self.outcome.provisioned = True
        log.info("stage %s: provisioned (layers %d..%d)", self._name, provision.layer_start,
                 provision.layer_end_exclusive)

    def _establish(self, ctx: Context[StageMail], edge: EdgeId, action: Awaitable[None]) -> None:
        provision = self._provision
        assert provision is not None
        self.ports.emit(EdgeProvisionStarted(
            node_id=self.config.node_id, run_id=provision.run_id, edge_id=edge,
        ))

        def failed(error: BaseException) -> scm.Event:
            reason = (error.reason if isinstance(error, RunFaultError)
                      else RunFaultReason.EdgeEstablishmentFailed)
            return scm.EdgeFault(edge, reason, Component.EdgeEstablisher)

        self._establishing.append(ctx.spawn_task(self._call(ctx, action, failed)))

    def _stage_ready(self) -> None:
        provision = self._provision
        assert provision is not None
        fp = self._footprint
        self.ports.emit(StageReady(
            node_id=self.config.node_id, run_id=provision.run_id,
            stage_index=provision.stage_index,
            worker_generation=self.ports.worker_generation(),
            weights_bytes=None if fp is None else fp.weights_bytes,
            kv_cache_bytes=None if fp is None else fp.kv_cache_bytes,
            rss_bytes=None if fp is None else fp.rss_bytes,
            file_bytes=None if fp is None else fp.file_bytes,
            role_reused=None if fp is None else fp.reused,
        ))

    async def _grant(self, ctx: Context[StageMail]) -> None:
        """Send the standing step grant (module doc)."""
        provision = self._provision
        assert provision is not None
        first = StepId(self.config.first_step_id)
        role = provision.runtime.role_id
        self._granted = True
        self._last_ns = time.monotonic_ns()
        try:
            command = self._command(provision, first)
        except RunFaultError as error:
            log.warning("stage %s: steps not granted: %s", self._name, error)
            ctx.self_ref.tell(scm.StepFailed(role, first, _step_failure(error)))
            return
        await self._call(ctx, self.ports.grant_steps(command),
                         lambda e: scm.StepFailed(role, first, _step_failure(e)))

    def _command(self, provision: ProvisionStage, first: StepId) -> wire.GrantSteps:
        inbound = self._rings.get(provision.inbound.edge_id)
        ring = self._rings.get(provision.outbound.edge_id)
        if inbound is None or ring is None:
            raise RunFaultError(RunFaultReason.StepFailed, "edge ring unknown")
        runtime = provision.runtime
        sequence = Sequence(0)
        return wire.GrantSteps(
            role_id=runtime.role_id,
            first_step_id=first,
            input=AwaitedInput(runtime.input_port, inbound, sequence,
                               provision.inbound.object_spec.alignment),
            output=output_binding(provision, runtime.output_port, ring, sequence),
        )

    def _record(self, step_id: StepId, record: StepRecord) -> None:
        """Count a reported step and emit its four events at the worker's times, in one
        `emit_all` (one write of the events file per step)."""
        self.outcome.steps_completed += 1
        provision = self._provision
        assert provision is not None
        node, run, stage = self.config.node_id, provision.run_id, provision.stage_index
        generation = self.ports.worker_generation()
        sequence = record.sequence
        inbound, outbound = provision.inbound.edge_id, provision.outbound.edge_id
        loaded = max(record.loaded_ns, self._last_ns)
        started = max(record.started_ns, loaded)
        produced = max(record.produced_ns, started)
        completed = self._last_ns = max(record.completed_ns, produced)
        self.ports.emit_all((
            (ObjectLoaded(
                node_id=node, run_id=run, stage_index=stage, edge_id=inbound,
                ring_id=self._rings[inbound], object_id=record.input_object_id,
                sequence=sequence, worker_generation=generation,
                detail={"extent": record.input_extent},
            ), loaded),
            (ExecuteStepStarted(
                node_id=node, run_id=run, stage_index=stage, step_id=step_id,
                sequence=sequence, worker_generation=generation,
            ), started),
            (ObjectProduced(
                node_id=node, run_id=run, stage_index=stage, edge_id=outbound,
                ring_id=self._rings[outbound], object_id=record.output_object_id,
                sequence=sequence, step_id=step_id, worker_generation=generation,
                detail={"extent": record.output_extent},
            ), produced),
            (StepCompleted(
                node_id=node, run_id=run, stage_index=stage, step_id=step_id,
                sequence=sequence, worker_generation=generation,
            ), completed),
        ))

    async def _stop_edges(self, ctx: Context[StageMail]) -> None:
        provision = self._provision
        assert provision is not None
        inbound, outbound = provision.inbound.edge_id, provision.outbound.edge_id
        # An establishment not yet under way when StopRun came would take its lease after
        # the stop (a leaked lease): let each end (a failure is an EdgeFault, ignored now).
        await asyncio.gather(*map(asyncio.shield, self._establishing), return_exceptions=True)
        try:
            await self.ports.stop_edges(inbound, outbound)
        except Exception as error:
            log.warning("stage %s: stop_edges failed: %s", self._name, error)
            ctx.self_ref.tell(scm.EdgeStopped(inbound, clean=False))
            ctx.self_ref.tell(scm.EdgeStopped(outbound, clean=False))

    async def _reset_role(self) -> None:
        provision = self._provision
        assert provision is not None
        try:
            await self.ports.reset_role(provision.runtime.role_id)
        except Exception as error:
            log.warning("stage %s: reset_role failed: %s", self._name, error)
            self._teardown.unclean.append("role reset failed")

    async def _stage_stopped(self, clean: bool) -> None:
        self.outcome.stopped = True
        self.outcome.clean = clean
        claim = self._provision or self._claim
        if claim is None:
            log.info("stage: StopRun before any ProvisionStage; no stage to report")
            return
        if self._teardown.unclean:
            log.warning("stage %s: unclean stop: %s", self._name, "; ".join(self._teardown.unclean))
        self.ports.emit(StageStopped(
            node_id=self.config.node_id, run_id=claim.run_id, stage_index=claim.stage_index,
            detail={"clean": clean},
        ))
        await self._report(orun.StageStopped(claim.stage_index, clean))

    async def _report(self, message: StageReport,
                      footprint: wire.StageFootprint | None = None) -> None:
        claim = self._provision or self._claim
        assert claim is not None
        await self._send(self.config.orchestrator, claim.run_id, message, footprint)

    async def _send(self, to: NodeId, run: RunId, message: StageReport,
                    footprint: wire.StageFootprint | None = None) -> None:
        try:
            await self.ports.report(to, run, message, footprint)
        except Exception as error:  # the orchestrator's own timers cover a lost report
            log.warning("stage %s: report %s failed: %s", self._name,
                        type(message).__name__, error)

    # -- port calls ------------------------------------------------------------------------

    def _start(
        self,
        ctx: Context[StageMail],
        action: Awaitable[None],
        on_error: Callable[[BaseException], scm.Event],
    ) -> None:
        ctx.spawn_task(self._call(ctx, action, on_error))

    async def _call(
        self,
        ctx: Context[StageMail],
        action: Awaitable[None],
        on_error: Callable[[BaseException], scm.Event],
    ) -> None:
        try:
            await action
        except Exception as error:  # a port failure becomes the machine's event
            log.warning("stage %s: port action failed: %s", self._name, error)
            ctx.self_ref.tell(on_error(error))

    def _finish(self, ctx: Context[StageMail]) -> None:
        if not self._finished.done():
            self._finished.set_result(self.outcome)
        ctx.stop_self()


def provision_problem(
    config: StageControllerConfig, sender: NodeId, provision: ProvisionStage
) -> str | None:
    """Why a node with `config` must refuse `provision` from `sender` (spec §4), or None."""
    trusted = config.orchestrator
    run = provision.run_id
    if sender != trusted:
        return f"sender node {int(sender)} is not the trusted orchestrator {int(trusted)}"
    if config.active_run is not None and run != config.active_run:
        return f"run {int(run)} is not this node's active run {int(config.active_run)}"
    if run in config.retired_runs:
        return f"run {int(run)} already ran on this node"
    outbound = provision.outbound
    if outbound.kind is EdgeKind.TokenOut and outbound.consumer_node_id != trusted:
        return (f"the last stage's tokens go to node {int(outbound.consumer_node_id)}, "
                f"not the orchestrator {int(trusted)}")
    return None


def output_binding(provision: ProvisionStage, port: PortId, ring: RingId,
                   sequence: Sequence) -> OutputBinding:
    """The armed step's output: object `sequence + 1` on the outbound ring with the same
    sequence; one token id from the last stage, else one outbound row per input row."""
    outbound = provision.outbound
    if outbound.kind is EdgeKind.TokenOut:
        return OutputBinding(port, ring, ObjectId(sequence + 1), sequence,
                             outbound.object_spec.dtype_width_bytes)
    return OutputBinding(port, ring, ObjectId(sequence + 1), sequence,
                         outbound.object_spec.alignment, per_input_row=True)


def output_extent(provision: ProvisionStage, input_extent: int) -> int:
    """Bytes of the step's output object for an input of `input_extent` bytes.

    The input holds `input_extent / alignment` rows (token ids in, or rows of `hidden *
    width` bytes); a non-last stage writes as many activation rows, the last stage one
    token id.
    """
    inbound = provision.inbound.object_spec
    outbound = provision.outbound.object_spec
    if provision.outbound.kind is EdgeKind.TokenOut:
        return outbound.dtype_width_bytes
    rows = input_extent // inbound.alignment
    return rows * outbound.alignment


def _role_failure(error: BaseException) -> RoleFailure:
    if isinstance(error, RunFaultError) and error.reason in _WORKER_GONE:
        return RoleFailure.WorkerProcessExited
    return RoleFailure.ConfigInvalid


def _weights_reason(error: BaseException) -> RunFaultReason:
    if isinstance(error, RunFaultError) and error.reason in WEIGHT_REASONS:
        return error.reason
    return RunFaultReason.WeightLoadFailed


def _step_failure(error: BaseException) -> StepFailure:
    if isinstance(error, RunFaultError) and error.reason in _WORKER_GONE:
        return StepFailure.WorkerProcessExited
    return StepFailure.RoleUnavailable


