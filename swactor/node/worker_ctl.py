"""GpuWorkerCtl: the node actor that owns the GPU worker process (spec §28, §31).

Theory of operation
-------------------
The actor binds the generated gpu_worker_ctl machine: every message becomes a machine
event, and the binding carries out the effects (timers included) that come back.

Mail it takes:

- commands from node actors, as the machine's own event classes (`gwc.StartWorker`,
  `gwc.InstallRing(command)`, `gwc.UninstallRing`, `gwc.ConfigureRole`,
  `gwc.GrantSteps`, `gwc.RevokeSteps`, `gwc.ReleaseDeviceObject`,
  `gwc.ShutdownWorker`); steps run only under standing grants (spec §29's
  ExecuteStep is not a command here, fsm/gpu_worker_ctl.yaml);
- what its ProcessActor reports (`Started`, `SpawnFailed`, `Line`, `Exited`): the
  worker I/O adapter is `decode_worker_line`, which turns a stdout line into a machine
  event: WorkerReady / WorkerFatal / WorkerStopped, any other §30 event as
  `gwc.WorkerEvent` carrying it (RouteWorkerEvent hands it on), and anything
  malformed (not JSON, unknown shape, bad body, truncated) as `gwc.AdapterFailed`. It is
  total, so no worker output can raise inside the node. Mail from the process actor of
  an older generation is ignored.

What it sends (`WorkerRoutes`): worker events by type - ring events to the
EdgeEstablisher and the ring's edge actor, object events to the StageController only
(the Tx/Rx edge actors are lifecycle gates that objects do not pass: fsm/rx_edge.yaml),
step/role/device events to the StageController (the run's own, `active_stage`, while
the node's StageHost has one; the host otherwise) - and its own
notices: `WorkerReadyNotice` /
`WorkerFailedNotice` to node boot, `WorkerCrashed` to the StageControllers,
`WorkerReaped(ring_id)` to the EdgeEstablisher. Commands it cannot forward are answered
with the §30 event a worker would have sent (RingFault, StepFailed, RoleFailed,
DeviceObjectReleased), so every waiter ends.

Bookkeeping the guards answer: the worker generation (starts at 1, +1 per restart, sent
in InitializeWorker and checked in WorkerReady), the installed-ring table of the current
generation (InstallRing adds, RingQuiesced / reaping removes), the standing step grants
forwarded to the worker with how many of their steps it reported (a crash fails each
grant's next step, the one in flight, with WorkerProcessExited), the restart budget
(`max_restarts` within a sliding `restart_window_s`, so only a crash loop exhausts it),
and the commands held while the next generation starts (`deferred`: written in arrival
order when it is ready, answered as refused if it never is, an InstallRing dropped when
its ring is uninstalled first).
Wake hints (spec §21) between node and worker go through the `WorkerDoorbells` the actor
is given (`doorbells`, the node's) and hands to every worker generation; they do not pass
this actor: the node's `WorkerRingInstaller` reads and rings them on the event loop
(`swactor.transport.WorkerWakeRoute`). Every GpuWorkerCtl has a set, so its workers
never write hint lines; one a worker writes anyway is routed to nobody.

On a crash the StageControllers hear `WorkerCrashed` first (with the WorkerFatal reason
when the worker reported one before it exited), then each grant's step in flight is
failed and
every installed ring is reported faulted (RingFault WorkerProcessExited) and,
when the actor was given the arena, its shared state word is faulted too, so a pump
blocked on it wakes with RingFaulted instead of waiting for a dead peer.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from swactor.actors import Actor, ActorRef, Context
from swactor.actors.process import (
    Exited,
    Line,
    ProcessCommand,
    ProcessEvent,
    ProcessSpec,
    SpawnFailed,
    Started,
    StopProcess,
    Stream,
    WriteLine,
    spawn_process,
)
from swactor.actors.supervision import RestartBudget
from swactor.arena import Arena
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.host import MachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.ring import Ring, RingError, WorkerDoorbells
from swactor.ring._ring_cffi import lib as _ring_lib
from swactor.wire import (
    ConfigureRole,
    DeviceObjectHandle,
    DeviceObjectReleased,
    GrantSteps,
    InitializeWorker,
    InstallRing,
    JsonValue,
    ObjectFailed,
    ObjectLoaded,
    ObjectProduced,
    ReleaseDeviceObject,
    RevokeSteps,
    RingFault,
    RingFaultReason,
    RingId,
    RingInstalled,
    RingQuiesced,
    RingReadable,
    RingWritable,
    RoleFailed,
    RoleFailure,
    RoleId,
    ShutdownMode,
    ShutdownWorker,
    StepCompleted,
    StepFailed,
    StepFailure,
    StepId,
    UninstallReason,
    UninstallRing,
    WireError,
    WireStruct,
    WorkerEvent,
    WorkerFatal,
    WorkerFatalReason,
    WorkerGeneration,
    WorkerReady,
    WorkerReaped,
    WorkerStopped,
    decode_event,
    encode_line,
)

log = logging.getLogger(__name__)

STDERR_TAIL_CHARS = 400
"""The most of the worker's last stderr line a `WorkerFailedNotice` carries."""

RING_HELPER_ABI: int = _ring_lib.RING_ABI_VERSION
"""The native ring helper ABI this node requires (native/ring.h RING_ABI_VERSION)."""


# -- notices this actor sends -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerReadyNotice:
    """The worker of `generation` is running (to node boot)."""

    generation: WorkerGeneration
    pid: int
    backend: JsonValue


@dataclass(frozen=True, slots=True)
class WorkerFailedNotice:
    """The worker cannot run: init failure, or a crash without restart (to node boot)."""

    generation: WorkerGeneration
    fatal: WorkerFatalReason | None = None
    """The reason of the WorkerFatal the worker reported before it exited, if it did."""
    stderr_tail: str = ""
    """The last line the worker wrote on stderr, at most `STDERR_TAIL_CHARS` (its own
    account of the failure: a backend's exception, say)."""


@dataclass(frozen=True, slots=True)
class WorkerCrashed:
    """The worker process of `generation` exited unexpectedly (to StageControllers)."""

    generation: WorkerGeneration
    exit_code: int
    fatal: WorkerFatalReason | None = None
    """The reason of the WorkerFatal the worker reported before it exited, if it did."""


Notice = WorkerReadyNotice | WorkerFailedNotice | WorkerCrashed | WorkerReaped


Route = ActorRef[Any]
"""An actor worker events and notices go to (each takes its own kinds of mail)."""


@dataclass
class WorkerRoutes:
    """Where worker events and notices go; every field may be left empty."""

    node_boot: Route | None = None
    establisher: Route | None = None
    driver: Route | None = None
    stage_controllers: list[Route] = field(default_factory=list)
    edges: dict[RingId, Route] = field(default_factory=dict)
    active_stage: Route | None = None
    """While set, what would go to `stage_controllers` goes to it alone: the node's
    StageHost points it at the run's StageController for the run's life, so a step's
    StepCompleted (one per token) reaches the controller in one mailbox hop, not two
    (the host would only forward it)."""

    def targets(self, event: WorkerEvent | Notice) -> Iterable[Route]:
        """The actors `event` is routed to."""
        ring_id = getattr(event, "ring_id", None)
        edge = self.edges.get(ring_id) if ring_id is not None else None
        found: list[Route | None] = []
        match event:
            case RingInstalled() | RingQuiesced() | WorkerReaped():
                found = [self.establisher, edge]
            case RingFault():
                found = [self.establisher, self.driver, edge]
            case ObjectLoaded() | ObjectProduced() | ObjectFailed():
                found = self._stage()  # not through the edge actors (§27 doc)
            case RingReadable() | RingWritable():
                found = []  # hints ring the doorbells (module doc)
            case WorkerReadyNotice() | WorkerFailedNotice():
                found = [self.node_boot]
            case _:
                found = self._stage()
        return [ref for ref in found if ref is not None]

    def _stage(self) -> list[Route | None]:
        active = self.active_stage
        return [active] if active is not None else list(self.stage_controllers)


@dataclass(frozen=True)
class WorkerCtlConfig:
    """How to run the worker and the machine's timings."""

    arena_fd: int
    arena_bytes: int
    backend: JsonValue = None
    argv: tuple[str, ...] = (sys.executable, "-m", "swactor.worker")
    init_timeout_s: float = 120.0
    stop_grace_s: float = 10.0
    crash_teardown_timeout_s: float = 10.0
    restart_backoff_s: float = 0.2
    max_restarts: int = 3
    """Restarts allowed within `restart_window_s`: one more crash inside the window is
    Failed (a crash loop ends the node's worker; a crash now and then does not)."""
    restart_window_s: float = 60.0
    kill_grace_s: float = 0.5
    required_ring_helper_abi: int = RING_HELPER_ABI


# -- the adapter ------------------------------------------------------------------------


def decode_worker_line(text: str, truncated: bool = False) -> gwc.Event:
    """The machine event for one worker stdout line, carrying what the worker sent.

    Total: anything that is not one well-formed §30 event is AdapterFailed."""
    if truncated:
        return gwc.AdapterFailed()
    try:
        event = decode_event(text)
    except (WireError, ValueError, TypeError, RecursionError):
        return gwc.AdapterFailed()
    match event:
        case WorkerReady():
            return gwc.WorkerReady(event.pid, event.worker_generation, event.ring_helper_abi,
                                   event.backend)
        case WorkerFatal():
            return gwc.WorkerFatal(event.reason)
        case WorkerStopped():
            return gwc.WorkerStopped(event.reason)
    return gwc.WorkerEvent(event)


# -- the actor --------------------------------------------------------------------------

Mail = gwc.Event | ProcessEvent
Deferred = InstallRing | ConfigureRole | GrantSteps
"""A command held while the next worker generation starts (Defer* effects)."""

_FROM_WORKER = (gwc.WorkerReady, gwc.WorkerFatal, gwc.WorkerStopped, gwc.WorkerEvent)


class GpuWorkerCtl(Actor[Mail], gwc.GpuWorkerCtlEffects[None]):
    """Owns one worker process per generation; see the module docstring."""

    def __init__(
        self,
        config: WorkerCtlConfig,
        routes: WorkerRoutes,
        arena: Arena | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        doorbells: WorkerDoorbells,
    ) -> None:
        """`clock` (seconds, monotonic) times the restart budget's window; `doorbells`
        (its owner closes them) go to every worker generation (module doc)."""
        self.config = config
        self.clock = clock
        self.routes = routes
        self.arena = arena
        self.generation = WorkerGeneration(1)
        self.restarts = 0
        """Restarts over the life of this GpuWorkerCtl (the budget counts a window)."""
        self.budget = RestartBudget(config.max_restarts, config.restart_window_s)
        self.installed: dict[RingId, InstallRing] = {}
        self.grants: dict[RoleId, tuple[GrantSteps, int]] = {}
        """Each role's forwarded grant and how many of its steps the worker reported."""
        self.deferred: list[Deferred] = []
        self.pid: int | None = None
        self.exit_code = 0
        self.fatal: WorkerFatalReason | None = None
        """The current generation's WorkerFatal reason (NoteWorkerFatal), if any."""
        self.stderr_tail = ""
        """The current generation's last stderr line (`WorkerFailedNotice.stderr_tail`)."""
        self.process: ActorRef[ProcessCommand] | None = None
        self._ctx: Context[Mail] | None = None
        self.doorbells = doorbells
        self.machine = gwc.GpuWorkerCtlMachine(
            self,
            init_timeout_s=config.init_timeout_s,
            stop_grace_s=config.stop_grace_s,
            crash_teardown_timeout_s=config.crash_teardown_timeout_s,
            restart_backoff_s=config.restart_backoff_s,
        )
        self._host = MachineHost(self.machine, gwc.bind(self), timer_events=gwc.TIMER_EVENTS,
                                 rejected=self._refused)

    @property
    def state(self) -> gwc.State:
        return self.machine.state

    # -- guards -----------------------------------------------------------------------

    def is_current_generation(self, event: gwc.WorkerReady) -> bool:
        return event.worker_generation == self.generation

    def is_installed_ring(self, event: gwc.UninstallRing) -> bool:
        return event.ring_id in self.installed

    def has_installed_rings(self, event: gwc.ProcessExited) -> bool:
        return bool(self.installed)

    def may_restart(
        self, event: gwc.ProcessExited | gwc.UninstallRing | gwc.CrashTeardownTimeout
    ) -> bool:
        return self.budget.would_allow(self.clock())

    def rings_remain(self, event: gwc.UninstallRing) -> bool:
        return bool(set(self.installed) - {event.ring_id})

    # -- mail -------------------------------------------------------------------------

    async def started(self, ctx: Context[Mail]) -> None:
        self._ctx = ctx
        self._host.timers = ctx.timers

    async def receive(self, ctx: Context[Mail], message: Mail) -> None:
        event = self._translate(message)
        if event is not None:
            self._host.feed(event)

    def _refused(self, event: gwc.Event, error: ProtocolError) -> None:
        log.warning("GpuWorkerCtl: %s", error)
        if isinstance(event, _FROM_WORKER):
            # A worker event out of protocol (a second WorkerReady, WorkerStopped while
            # running) is an adapter fault, like an unknown event shape (spec §28).
            self._host.feed(gwc.AdapterFailed())

    def _translate(self, message: Mail) -> gwc.Event | None:
        match message:
            case Started() | SpawnFailed() | Line() | Exited():
                if self.process is None or message.source != self.process.address:
                    return None  # an older generation's process actor
            case _:
                return message
        match message:
            case Started(pid=pid):
                self.pid = pid
                return gwc.ProcessStarted(pid)
            case SpawnFailed():
                log.error("worker spawn failed: %s", message.error)
                return gwc.ProcessSpawnFailed()
            case Line(stream=Stream.stderr, text=text):
                log.info("worker g%d: %s", int(self.generation), text)
                if text.strip():
                    self.stderr_tail = text.strip()[:STDERR_TAIL_CHARS]
                return None
            case Line(text=text, truncated=truncated):
                event = decode_worker_line(text, truncated)
                if isinstance(event, gwc.AdapterFailed):
                    log.error("worker g%d wrote a malformed control line (%d chars)",
                              int(self.generation), len(text))  # fmt: skip
                return event
            case Exited(code=code, signal=signum):
                self.pid = None
                self.exit_code = code if code is not None else -(signum or 0)
                return gwc.ProcessExited(self.exit_code)
        return None

    # -- effects ----------------------------------------------------------------------

    def _write(self, message: WireStruct) -> None:
        if self.process is not None:
            self.process.tell(WriteLine(encode_line(message).rstrip("\n")))

    def _route(self, event: WorkerEvent | Notice) -> None:
        for target in self.routes.targets(event):
            target.tell(event)

    @property
    def _context(self) -> Context[Mail]:
        assert self._ctx is not None, "effects run only once the actor started"
        return self._ctx

    # -- effects (GpuWorkerCtlEffects) ---------------------------------------------------

    def spawn_process(self) -> None:
        cfg = self.config
        env = {
            "SWACTOR_ARENA_FD": str(cfg.arena_fd),
            "SWACTOR_ARENA_BYTES": str(cfg.arena_bytes),
        }
        env.update(self.doorbells.env())
        fds = (cfg.arena_fd, *self.doorbells.fds())
        spec = ProcessSpec(cfg.argv, pass_fds=fds, extra_env=env, grace_s=cfg.kill_grace_s)
        ctx = self._context
        owner = cast(ActorRef[ProcessEvent], ctx.self_ref)
        self.process = spawn_process(ctx, spec, owner, f"worker-g{int(self.generation)}")

    def connect_adapter(self) -> None:
        pass  # the adapter is decode_worker_line over the process actor's Lines

    def send_initialize_worker(self) -> None:
        cfg = self.config
        self._write(InitializeWorker(self.generation, cfg.arena_bytes,
                                     cfg.required_ring_helper_abi, cfg.backend))

    def announce_worker_ready(self, worker_generation: WorkerGeneration, pid: int,
                              backend: JsonValue) -> None:
        self._route(WorkerReadyNotice(worker_generation, pid, backend))

    def report_worker_failed(self) -> None:
        self._route(WorkerFailedNotice(self.generation, self.fatal, self.stderr_tail))

    def report_worker_crashed(self) -> None:
        self._route(WorkerCrashed(self.generation, self.exit_code, self.fatal))

    def note_worker_fatal(self, reason: WorkerFatalReason) -> None:
        self.fatal = reason

    def kill_process(self) -> None:
        if self.process is not None:
            self.process.tell(StopProcess(self.config.kill_grace_s))

    def send_install_ring(self, command: InstallRing) -> None:
        self._send_command(command)

    def send_uninstall_ring(self, ring_id: RingId, reason: UninstallReason) -> None:
        self._write(UninstallRing(ring_id, reason))

    def send_configure_role(self, command: ConfigureRole) -> None:
        self._send_command(command)

    def send_grant_steps(self, command: GrantSteps) -> None:
        self._send_command(command)

    def send_revoke_steps(self, command: RevokeSteps) -> None:
        self.grants.pop(command.role_id, None)
        self._write(command)

    def reject_grant_steps(self, command: GrantSteps, reason: StepFailure) -> None:
        self._route(StepFailed(command.role_id, command.first_step_id, reason))

    def defer_grant_steps(self, command: GrantSteps) -> None:
        self.deferred.append(command)

    def drop_grant(self, command: RevokeSteps) -> None:
        self.grants.pop(command.role_id, None)
        self.deferred = [c for c in self.deferred
                         if not (isinstance(c, GrantSteps) and c.role_id == command.role_id)]

    def defer_install_ring(self, command: InstallRing) -> None:
        self.deferred.append(command)

    def defer_configure_role(self, command: ConfigureRole) -> None:
        self.deferred.append(command)

    def replay_deferred(self) -> None:
        pending, self.deferred = self.deferred, []
        for command in pending:
            self._send_command(command)

    def reject_deferred(self) -> None:
        pending, self.deferred = self.deferred, []
        for command in pending:
            self._reject_command(command)

    def send_release_device_object(self, device_handle: DeviceObjectHandle) -> None:
        self._write(ReleaseDeviceObject(device_handle))

    def send_shutdown_worker(self, mode: ShutdownMode) -> None:
        self._write(ShutdownWorker(mode))

    def route_worker_event(self, event: WorkerEvent) -> None:
        match event:
            case RingQuiesced(ring_id=ring_id):
                self.installed.pop(ring_id, None)
            case StepCompleted() | StepFailed():
                self._count_granted(event.role_id, event.step_id)
        self._route(event)

    def _count_granted(self, role: RoleId, step: StepId) -> None:
        """A step of `role`'s grant was reported: the next one is the grant's in flight."""
        held = self.grants.get(role)
        if held is not None and held[0].first_step_id + held[1] == step:
            self.grants[role] = (held[0], held[1] + 1)

    def reject_install_ring(self, command: InstallRing, reason: RingFaultReason) -> None:
        self._route(RingFault(command.ring_id, command.edge_id, command.port_id, reason))

    def reject_configure_role(self, command: ConfigureRole, reason: RoleFailure) -> None:
        self._route(RoleFailed(command.role_id, reason))

    def report_handle_released(self, device_handle: DeviceObjectHandle) -> None:
        self._route(DeviceObjectReleased(device_handle))

    def report_ring_reaped(self, ring_id: RingId) -> None:
        self.installed.pop(ring_id, None)
        self.deferred = [c for c in self.deferred
                         if not (isinstance(c, InstallRing) and c.ring_id == ring_id)]
        self._route(WorkerReaped(ring_id))

    def report_rings_reaped(self) -> None:
        for ring_id in list(self.installed):
            self._route(WorkerReaped(ring_id))
        self.installed.clear()

    def invalidate_generation(self) -> None:
        for role_id, (grant, reported) in list(self.grants.items()):
            step_id = StepId(grant.first_step_id + reported)
            self._route(StepFailed(role_id, step_id, StepFailure.WorkerProcessExited))
        self.grants.clear()

    def fault_installed_rings(self) -> None:
        reason = RingFaultReason.WorkerProcessExited
        for command in self.installed.values():
            if self.arena is not None:
                try:
                    with Ring.open(self.arena, command.layout) as ring:
                        ring.fault(reason)
                except RingError as exc:
                    log.warning("ring %d: cannot fault: %s", int(command.ring_id), exc)
            self._route(RingFault(command.ring_id, command.edge_id, command.port_id, reason))

    def increment_generation(self) -> None:
        self.generation = WorkerGeneration(self.generation + 1)
        self.restarts += 1
        self.budget.record(self.clock())
        self.fatal = None
        self.stderr_tail = ""
        self.installed.clear()
        self.process = None

    def _send_command(self, command: Deferred) -> None:
        """Write a command to the running worker, with its bookkeeping."""
        match command:
            case InstallRing(ring_id=ring_id):
                self.installed[ring_id] = command
            case GrantSteps(role_id=role_id):
                self.grants[role_id] = (command, 0)
            case _:
                pass
        self._write(command)

    def _reject_command(self, command: Deferred) -> None:
        """Answer a held command the worker generation never came up to run."""
        match command:
            case InstallRing():
                self._route(RingFault(command.ring_id, command.edge_id, command.port_id,
                                      RingFaultReason.WorkerProcessExited))
            case GrantSteps():
                self._route(StepFailed(command.role_id, command.first_step_id,
                                       StepFailure.WorkerProcessExited))
            case _:
                self._route(RoleFailed(command.role_id, RoleFailure.WorkerProcessExited))


__all__ = [
    "GpuWorkerCtl",
    "Notice",
    "WorkerCrashed",
    "WorkerCtlConfig",
    "WorkerFailedNotice",
    "WorkerReadyNotice",
    "WorkerRoutes",
    "decode_worker_line",
]
