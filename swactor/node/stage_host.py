"""The node's StageHost actor: one fresh StageController per run, one stable address.

Theory of operation. A node serves one stage of one run at a time and must accept the
next run after teardown without a restart (spec §38). `StageHost` is the
node-lifetime actor that other node actors and the control channel address; it owns at
most one *active* `StageController` child and forwards to it:

- `scm.ProvisionStage(orchestrator=sender, provision)`: checked first with the
  controller's own `provision_problem` (trusted sender, a run this node has not served
  yet, tokens back to the orchestrator); a refused one is answered StageFault
  (ProvisioningRejected) by the host and spawns nothing, so a stray sender cannot
  occupy the node. With no active controller, a fresh one is spawned (its config lists
  the runs this node already served) and handed the message; its guard repeats the
  check. For the active run it is forwarded (the controller rejects a second
  provisioning). For another run while one is active, the host refuses it: the node
  is busy.
- `StopRunRequest(sender, run_id, stage_index)`: from a node other than the trusted
  orchestrator it is dropped and logged (spec §4). For the active run it becomes the
  controller's StopRun. For a run this node is not serving (never provisioned here, or
  refused) the host answers StageStopped(clean) at once: there is nothing to stop.
- everything else (GpuWorkerCtl's worker events and WorkerCrashed, the edge actors'
  EdgeReady/EdgeFault/EdgeStopped, the weight loader's reports): forwarded to the
  active controller, dropped when there is none. GpuWorkerCtl's mail skips this hop
  while a controller is active: given the node's `WorkerRoutes`, the host points their
  `active_stage` at the controller from its spawn until the host hears it finished, so
  a step's report (one per token) costs one mailbox hop, not two. The host takes
  GpuWorkerCtl's mail itself only when no controller is active (a preload's answers).

Preloading (extension beyond the spec, for warm spares). `PreloadRequest(sender,
provision, answer)` (the control channel's `PreloadStage`) configures the worker role of
`provision`'s stage while the node is idle, outside any run: the weight port's
`load_weights` and `configure_role`, exactly as a controller's setup does, with no edge,
no controller and no run opened. The worker's RoleConfigured or RoleFailed for that role
(or its crash) resolves `answer` with a `PreloadOutcome`; the location is then dropped
(`reset_role`), while the worker keeps the role, so a later run that provisions this
node with the same stage of the same file re-arms it without loading (the worker's
`reconfigure`). Only the trusted orchestrator may preload; a node serving a run, or
already preloading, refuses (answer not ok, naming why). A ProvisionStage that arrives
while a preload is under way waits for it, then is handled as usual (a run never
races a preload for the worker).

When the active controller reaches Stopped its `StageOutcome` is appended to
`StageHostState.history` (the last `HISTORY_KEPT`), its run id is retired, and the
host is idle again: the next ProvisionStage gets a new controller with fresh
bookkeeping and gate, and step ids from a range no earlier run used (role ids repeat
across runs, so a late StepCompleted of the last run must not match a step of this
one). Because
per-run state lives only in the controller, nothing of one run survives into the next;
the worker-side state (role, rings, device objects) is released by the controller's own
teardown effects (ResetRole, ReleaseRunObjects, StopEdges) before it reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from swactor.actors import Actor, ActorRef, Context
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import (
    DEFAULT_STOPPING_GRACE_S,
    STEP_IDS_PER_RUN,
    StageController,
    StageControllerConfig,
    StageMail,
    provision_problem,
)
from swactor.node.stage_ports import StageOutcome, StagePorts, StageReport
from swactor.node.worker_ctl import WorkerCrashed as WorkerCrashedNotice
from swactor.node.worker_ctl import WorkerRoutes
from swactor.wire import (
    Component,
    NodeId,
    ProvisionStage,
    RoleConfigured,
    RoleFailed,
    RoleId,
    RunFaultReason,
    RunId,
    StageFootprint,
    StageIndex,
)

log = logging.getLogger("swactor.node.stage_host")

HISTORY_KEPT = 256
"""How many finished runs' `StageOutcome`s `StageHostState.history` keeps (the node's
status lists them as `runs_served`): enough for any test or operator looking back, and a
bound, since a node serves runs for as long as it lives. `retired_runs` is not bounded:
it is the authority record that no run id is served twice (one int per run)."""
REFUSED_KEPT = 256
"""How many of the latest refusal lines `StageHostState.refused` keeps; older ones are
only counted (`refused_dropped`), since any peer may send refusable messages forever."""


@dataclass(frozen=True, slots=True)
class StopRunRequest:
    """StopRun as it arrives on the control channel: who sent it, for which stage."""

    sender: NodeId
    run_id: RunId
    stage_index: StageIndex


@dataclass(frozen=True, slots=True)
class _ControllerDone:
    run_id: RunId | None
    outcome: StageOutcome | None


@dataclass(frozen=True, slots=True)
class PreloadOutcome:
    """How a preload ended: `ok` with the role's measured footprint, or why not."""

    ok: bool
    detail: str = ""
    footprint: StageFootprint | None = None


@dataclass(frozen=True, slots=True)
class PreloadRequest:
    """Configure `provision`'s stage role now, outside any run (module doc)."""

    sender: NodeId
    provision: ProvisionStage
    answer: asyncio.Future[PreloadOutcome]


@dataclass(frozen=True, slots=True)
class _PreloadFailed:
    role_id: RoleId
    detail: str


HostMail = StageMail | StopRunRequest | _ControllerDone | PreloadRequest | _PreloadFailed


@dataclass(slots=True)
class StageHostState:
    """What the host has done, readable by the node (and tests) at any time."""

    active_run: RunId | None = None
    retired_runs: set[RunId] = field(default_factory=set)
    history: deque[StageOutcome] = field(
        default_factory=lambda: deque(maxlen=HISTORY_KEPT))
    """The last `HISTORY_KEPT` outcomes, oldest first."""
    refused: deque[str] = field(default_factory=lambda: deque(maxlen=REFUSED_KEPT))
    """The last `REFUSED_KEPT` provisioning and StopRun messages the host itself
    refused, one line each, oldest first."""
    refused_dropped: int = 0
    """How many older refusals fell out of `refused` (counted, not kept)."""

    def refuse(self, line: str) -> None:
        """Record one refusal: keep its line, count the one it pushes out."""
        if len(self.refused) == self.refused.maxlen:
            self.refused_dropped += 1
        self.refused.append(line)


@dataclass(frozen=True, slots=True)
class StageHostConfig:
    """This node's id and the orchestrator it trusts."""

    node_id: NodeId
    orchestrator: NodeId
    stopping_grace_s: float = DEFAULT_STOPPING_GRACE_S


class StageHost(Actor[HostMail]):
    """The node's stage slot: one StageController per run (module doc)."""

    def __init__(
        self,
        config: StageHostConfig,
        ports: StagePorts,
        state: StageHostState | None = None,
        on_finished: Callable[[StageOutcome], None] | None = None,
        routes: WorkerRoutes | None = None,
    ) -> None:
        """`routes`: the node's worker routes, pointed at each run's controller (module
        doc); None leaves GpuWorkerCtl's mail coming through the host."""
        self.config = config
        self.ports = ports
        self.state = state if state is not None else StageHostState()
        self._on_finished = on_finished
        self._routes = routes
        self._active: ActorRef[StageMail] | None = None
        self._serial = 0
        self._preload: tuple[RoleId, asyncio.Future[PreloadOutcome]] | None = None
        self._deferred: list[scm.ProvisionStage] = []
        self.preloads = 0
        """Preloads this host completed (ok), for the node's status."""

    async def receive(self, ctx: Context[HostMail], message: HostMail) -> None:
        match message:
            case scm.ProvisionStage() if self._preload is not None:
                self._deferred.append(message)  # after the preload (module doc)
            case scm.ProvisionStage():
                await self._provision(ctx, message)
            case StopRunRequest():
                self._deferred = [d for d in self._deferred
                                  if d.provision.run_id != message.run_id]
                await self._stop_run(message)
            case _ControllerDone():
                self._done(message)
            case PreloadRequest():
                self._start_preload(ctx, message)
            case _PreloadFailed():
                self._preloaded(ctx, message.role_id, PreloadOutcome(False, message.detail))
            case RoleConfigured() if self._preloading(message.role_id):
                self._preloaded(ctx, message.role_id, PreloadOutcome(True, "", message.footprint))
            case RoleFailed() if self._preloading(message.role_id):
                self._preloaded(ctx, message.role_id, PreloadOutcome(
                    False, f"the worker could not configure the role ({message.reason.value})"))
            case WorkerCrashedNotice() if self._preload is not None:
                self._preloaded(ctx, self._preload[0],
                                PreloadOutcome(False, "the worker crashed while preloading"))
            case _:
                if self._active is not None:
                    self._active.tell(message)
                else:
                    log.info("stage host: no active stage for %s", type(message).__name__)

    # -- preloading (module doc) --------------------------------------------------------

    def _preloading(self, role: RoleId) -> bool:
        return self._active is None and self._preload is not None and self._preload[0] == role

    def _start_preload(self, ctx: Context[HostMail], request: PreloadRequest) -> None:
        busy = ("not the trusted orchestrator" if request.sender != self.config.orchestrator
                else f"node busy with run {int(self.state.active_run or 0)}"
                if self._active is not None
                else "another preload is under way" if self._preload is not None else None)
        if busy is not None:
            if not request.answer.done():
                request.answer.set_result(PreloadOutcome(False, busy))
            return
        role = request.provision.runtime.role_id
        self._preload = (role, request.answer)
        ctx.spawn_task(self._load(ctx, request.provision))

    async def _load(self, ctx: Context[HostMail], provision: ProvisionStage) -> None:
        try:
            await self.ports.load_weights(provision)
            await self.ports.configure_role(provision)  # the worker answers the host
        except Exception as error:
            text = str(error).strip() or type(error).__name__
            ctx.self_ref.tell(_PreloadFailed(provision.runtime.role_id, text))

    def _preloaded(self, ctx: Context[HostMail], role: RoleId, outcome: PreloadOutcome) -> None:
        if self._preload is None or self._preload[0] != role:
            return
        _, answer = self._preload
        self._preload = None
        self.preloads += outcome.ok
        if not answer.done():
            answer.set_result(outcome)
        ctx.spawn_task(self._drop_location(role))
        deferred, self._deferred = self._deferred, []
        for message in deferred:
            ctx.self_ref.tell(message)

    async def _drop_location(self, role: RoleId) -> None:
        try:
            await self.ports.reset_role(role)
        except Exception as error:
            log.warning("stage host: dropping the preload's location failed: %s", error)

    async def _provision(self, ctx: Context[HostMail], message: scm.ProvisionStage) -> None:
        run = message.provision.run_id
        if self._active is not None:
            if run == self.state.active_run:
                self._active.tell(message)
                return
            await self._refuse(message, f"node busy with run {int(self.state.active_run or 0)}")
            return
        config = StageControllerConfig(
            node_id=self.config.node_id,
            orchestrator=self.config.orchestrator,
            retired_runs=frozenset(self.state.retired_runs),
            stopping_grace_s=self.config.stopping_grace_s,
            first_step_id=(self._serial + 1) * STEP_IDS_PER_RUN,
        )
        problem = provision_problem(config, message.orchestrator, message.provision)
        if problem is not None:
            await self._refuse(message, problem)
            return
        finished: asyncio.Future[StageOutcome] = asyncio.get_running_loop().create_future()
        self._serial += 1
        self._active = ctx.spawn(
            lambda: StageController(config, self.ports, finished),
            f"stage-{self._serial}",
        )
        if self._routes is not None:
            self._routes.active_stage = self._active
        self.state.active_run = run
        ctx.spawn_task(self._await_finish(ctx, run, finished))
        self._active.tell(message)

    async def _refuse(self, message: scm.ProvisionStage, problem: str) -> None:
        provision = message.provision
        self.state.refuse(f"ProvisionStage run {int(provision.run_id)}: {problem}")
        log.warning("stage host: %s", self.state.refused[-1])
        await self._answer(message.orchestrator, provision.run_id, orun.StageFault(
            provision.stage_index, RunFaultReason.ProvisioningRejected, Component.StageController,
        ))

    async def _await_finish(
        self, ctx: Context[HostMail], run: RunId, finished: asyncio.Future[StageOutcome]
    ) -> None:
        try:
            outcome: StageOutcome | None = await finished
        except Exception as error:  # the controller died without reaching Stopped
            log.error("stage host: controller of run %d ended: %s", int(run), error)
            outcome = None
        ctx.self_ref.tell(_ControllerDone(run, outcome))

    def _done(self, message: _ControllerDone) -> None:
        self._active = None
        if self._routes is not None:
            self._routes.active_stage = None
        self.state.active_run = None
        outcome = message.outcome
        if outcome is not None and outcome.provisioned and message.run_id is not None:
            self.state.retired_runs.add(message.run_id)
        if outcome is not None:
            self.state.history.append(outcome)
            if self._on_finished is not None:
                self._on_finished(outcome)

    async def _stop_run(self, request: StopRunRequest) -> None:
        if request.sender != self.config.orchestrator:
            self.state.refuse(
                f"StopRun run {int(request.run_id)} from node {int(request.sender)}: "
                "not the trusted orchestrator"
            )
            log.warning("stage host: %s", self.state.refused[-1])
            return
        if self._active is not None and request.run_id == self.state.active_run:
            self._active.tell(scm.StopRun(request.run_id))
            return
        await self._answer(request.sender, request.run_id,
                           orun.StageStopped(request.stage_index, clean=True))

    async def _answer(self, to: NodeId, run: RunId, message: StageReport) -> None:
        try:
            await self.ports.report(to, run, message)
        except Exception as error:
            log.warning("stage host: report %s failed: %s", type(message).__name__, error)
