"""The worker process: binding of the generated worker_process machine (spec §29, §31).

Theory of operation
-------------------
`WorkerProcess.run(stdin, stdout)` is the whole life of `python -m swactor.worker`.
It reads one command line at a time, turns it into a machine event (`adapter`), and
carries out the effects the machine returns:

- InitializeRuntime: attach the arena named by SWACTOR_ARENA_FD / SWACTOR_ARENA_BYTES
  (its size must equal `arena_ceiling`; else ArenaMapFailed), compare the native ring
  helper's ABI with the required one (RingHelperAbiMismatch), choose and probe the
  tinygrad device (BackendInitFailed), and set the CPU replay's thread count from the
  backend's `threads` (`swactor node --threads`; `swactor.model.cpu_graph`); then
  RuntimeInitialized -> WorkerReady, whose `backend` says which device was chosen
  (`{"device": "CPU"}` or CUDA) and with how many replay threads.
- CreateRingMachine / ForwardUninstall / AdvanceRing: the per-ring parser or producer
  (`ingress.IngressRing`, `egress.EgressRing`), fed InstallRing, UninstallRing and the
  wake hints. A ring that reaches Quiesced leaves the table; when the last one left (a
  run's teardown), the events so far are written (its RingQuiesced among them: the
  node's teardown waits for it), then the run's garbage is collected and freed heap
  pages go back to the kernel (`swactor.heap.release`).
- ApplyRoleConfig: build the role by kind (`roles`), RoleConfigured or RoleFailed.
  A role built (not re-armed) is frozen out of the collector's reach once its answer is
  written (`swactor.heap.settle`; thawed first when it replaced a role), so a run
  boundary's collection scans the run's objects, not the role's.
- ArmGrant / EndGrant / RejectGrant: a standing grant held on (dropped from) the step
  runner, or refused while draining (StepFailed of its first step); grants are the
  only way a step runs (spec §29's ExecuteStep is not a command here). Every
  ObjectLoaded an ingress ring emits is reported to the runner, which takes the
  objects of a granted ring and the output of each step, so their ObjectLoaded /
  ObjectProduced lines are not written: the step's StepCompleted carries them
  (`steps` module doc).
- ReleaseWhenSafe: free the handle's device memory (tinygrad keeps it alive while a
  step still uses it); DeviceObjectReleased or ReleaseFailed (StaleGeneration,
  UnknownHandle).
- BeginDrain: every grant is revoked; Graceful lets the running step finish (its
  rings keep taking wake hints), AbortInFlight fails it (WorkerShuttingDown); then
  every ring is uninstalled and, once all are quiesced, DrainComplete -> WorkerStopped, exit 0.
- EmitWorkerFatal / ExitProcess: the fault rows (bad command line, command in the wrong
  state, an exception escaping worker code): WorkerFatal, exit 1.

After every command the step runner is pumped and the drain condition re-checked.

Wake hints (spec §21) travel as JSON lines (RingReadable / RingWritable) unless the node
handed the worker a `WorkerDoorbells` set (SWACTOR_WAKE_FDS): then the loop polls stdin
and the `to_worker` doorbell together, a rung doorbell is one RingReadable/RingWritable
machine event for each installed ring (the ring machines ignore a hint that finds
nothing new), and the rings' own hints ring `readable` / `writable` instead of writing
lines. Events are then written in bursts: before the loop waits and before a step's
compute (`adapter.EventWriter`, buffered).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import traceback
from typing import BinaryIO

from swactor import heap
from swactor.arena import Arena, ArenaError
from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import egress_ring as er
from swactor.fsm.generated import ingress_ring as ir
from swactor.fsm.generated import worker_process as wp
from swactor.fsm.host import MachineHost
from swactor.model import cpu_graph
from swactor.ring import WorkerDoorbells
from swactor.ring._ring_cffi import lib as ring_lib
from swactor.wire import (
    ConfigureRole,
    DeviceObjectHandle,
    DeviceObjectReleased,
    GrantSteps,
    InstallRing,
    JsonValue,
    ObjectLoaded,
    ObjectProduced,
    ReleaseFailed,
    ReleaseFailure,
    RingDirection,
    RingFault,
    RingFaultReason,
    RingId,
    RingReadable,
    RingWritable,
    RoleConfigured,
    RoleFailed,
    RoleFailure,
    RoleId,
    ShutdownMode,
    StepFailed,
    StepFailure,
    UninstallReason,
    WorkerFatal,
    WorkerFatalReason,
    WorkerGeneration,
    WorkerReady,
    WorkerStopped,
    WorkerStoppedReason,
)
from swactor.wire import WorkerEvent as WireWorkerEvent
from swactor.worker.adapter import EventWriter, LineReader, parse_command, read_command_line
from swactor.worker.bridge import DeviceBridge, InvalidHandle, choose_device, choose_threads
from swactor.worker.egress import EgressRing
from swactor.worker.ingress import IngressRing
from swactor.worker.roles import Role, RoleConfigError, build_role, footprint_of
from swactor.worker.steps import StepRunner

log = logging.getLogger("swactor.worker")

_EGRESS_WAITING = (er.State.NeedWritableForHeader, er.State.NeedWritableForPayload)


def ring_helper_abi() -> int:
    """The ABI version of the loaded native ring helper."""
    return int(ring_lib.ring_abi_version())


class WorkerProcess(wp.WorkerProcessEffects[None]):
    """One worker process's state and effects (its WorkerProcessGuards are empty)."""

    def __init__(
        self,
        emit: EventWriter,
        doorbells: WorkerDoorbells | None = None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.emit = emit
        self.faults = faults
        """The fault port its rings, steps, device bridge and command loop consult."""
        self.doorbells = doorbells
        if doorbells is not None:
            emit.buffered = True  # flushed before each wait and each compute (module doc)
        self.machine = wp.WorkerProcessMachine(self)
        self.exit_code: int | None = None
        self.arena: Arena | None = None
        self.bridge: DeviceBridge | None = None
        self.generation = WorkerGeneration(0)
        self.backend: object = None
        self.rings: dict[RingId, IngressRing | EgressRing] = {}
        self.roles: dict[RoleId, Role] = {}
        self.steps: StepRunner | None = None
        self._host = MachineHost(self.machine, wp.bind(self))
        self._drain_mode: ShutdownMode | None = None

    # -- the loop -------------------------------------------------------------------------

    def run(self, stdin: BinaryIO) -> int:
        """Serve commands until an ExitProcess effect; return the exit status."""
        if self.doorbells is not None:
            return self._run_polled(stdin.fileno(), self.doorbells)
        while self.exit_code is None:
            line = read_command_line(stdin)
            if line is None:
                self.feed(wp.ControlClosed())
                break
            self.handle_line(line)
        return 0 if self.exit_code is None else self.exit_code

    def _run_polled(self, stdin: int, bells: WorkerDoorbells) -> int:
        """The loop with doorbells: stdin lines and `to_worker` rings, polled together."""
        reader = LineReader(stdin)
        poller = select.poll()
        poller.register(stdin, select.POLLIN)
        poller.register(bells.to_worker.fd, select.POLLIN)
        try:
            while self.exit_code is None:
                line = reader.next_line()
                if line is not None:
                    self.handle_line(line)
                    continue
                if reader.eof:
                    self.feed(wp.ControlClosed())
                    break
                self.emit.flush()
                for fd, _ in poller.poll():
                    if fd == stdin:
                        reader.fill()
                    elif bells.to_worker.drain() and self.exit_code is None:
                        self.wake_rings()
        finally:
            self.emit.flush()
        return 0 if self.exit_code is None else self.exit_code

    def wake_rings(self) -> None:
        """The `to_worker` doorbell rang: a wake hint for every installed ring."""
        try:
            for ring_id, ring in list(self.rings.items()):
                hint = (wp.RingReadable(ring_id) if isinstance(ring, IngressRing)
                        else wp.RingWritable(ring_id))
                self.feed(hint)
            if self.exit_code is None:
                self._progress()
        except Exception:
            log.error("unhandled exception:\n%s", traceback.format_exc())
            self.feed(wp.InternalError())

    def _ring_emit(self, event: WireWorkerEvent) -> None:
        """A ring machine's event: its wake hints ring a doorbell when there is one; the
        objects and outputs of granted steps are reported with their step."""
        bells = self.doorbells
        if bells is not None:
            if isinstance(event, RingReadable):
                bells.readable.notify()
                return
            if isinstance(event, RingWritable):
                bells.writable.notify()
                return
        steps = self.steps
        if steps is not None:
            if isinstance(event, ObjectLoaded) and steps.object_loaded(event):
                return  # a grant's: its step reports it
            if isinstance(event, ObjectProduced) and steps.object_produced(event):
                return  # a granted step's output: its StepCompleted reports it
        self.emit(event)

    def handle_line(self, line: bytes) -> None:
        """One stdin line: parse, feed, then let steps and the drain progress."""
        try:
            event = parse_command(line)
            if self.faults.worker_fatal(type(event).__name__):
                raise RuntimeError("injected exception in worker code")
            self.feed(event)
            if self.exit_code is None:
                self._progress()
        except Exception:
            log.error("unhandled exception:\n%s", traceback.format_exc())
            self.feed(wp.InternalError())

    def feed(self, event: wp.Event) -> None:
        self._host.feed(event)

    def _progress(self) -> None:
        if self.steps is not None:
            self.steps.pump()
        if self._drain_mode is not None and self.machine.state is wp.State.Draining:
            self._continue_drain()

    # -- effects (WorkerProcessEffects) -------------------------------------------------

    def initialize_runtime(self, worker_generation: WorkerGeneration, arena_ceiling: int,
                           required_ring_helper_abi: int, backend: JsonValue) -> None:
        self.backend = backend
        try:
            arena = Arena.from_env()
        except ArenaError as exc:
            log.error("arena: %s", exc)
            self.feed(wp.InitFailed(WorkerFatalReason.ArenaMapFailed))
            return
        if arena.size != arena_ceiling:
            log.error("arena holds %d bytes, InitializeWorker says %d", arena.size,
                      arena_ceiling)  # fmt: skip
            arena.close()
            self.feed(wp.InitFailed(WorkerFatalReason.ArenaMapFailed))
            return
        self.arena = arena
        abi = ring_helper_abi()
        if abi != required_ring_helper_abi:
            log.error("ring helper ABI %d, node requires %d", abi,
                      required_ring_helper_abi)  # fmt: skip
            self.feed(wp.InitFailed(WorkerFatalReason.RingHelperAbiMismatch))
            return
        self.generation = worker_generation
        try:
            bridge = DeviceBridge(choose_device(self.backend), self.generation, self.faults)
            threads = choose_threads(self.backend)
            if threads is not None:
                cpu_graph.set_threads(threads)
            bridge.probe()
        except Exception as exc:  # any backend failure is BackendInitFailed
            log.error("backend: %s: %s", type(exc).__name__, exc)
            self.feed(wp.InitFailed(WorkerFatalReason.BackendInitFailed))
            return
        self.bridge = bridge
        self.steps = StepRunner(
            bridge, self.roles, self.rings, self.emit, self.emit.flush, self.faults
        )
        self.feed(wp.RuntimeInitialized(os.getpid(), self.generation, abi))

    def emit_worker_ready(self, pid: int, worker_generation: WorkerGeneration,
                          ring_helper_abi: int) -> None:
        assert self.bridge is not None
        self.emit(WorkerReady(pid, worker_generation, ring_helper_abi,
                              {"device": self.bridge.device,
                               "threads": cpu_graph.threads()}))

    def emit_worker_fatal(self, reason: WorkerFatalReason) -> None:
        self.emit(WorkerFatal(reason))

    def protocol_violation(self, machine: str, state: str, event: str) -> None:
        log.error("command %s not allowed in state %s", event, state)
        self.emit(WorkerFatal(WorkerFatalReason.MalformedControlMessage))
        self.exit_code = 1

    def emit_worker_stopped(self, reason: WorkerStoppedReason) -> None:
        self.emit(WorkerStopped(reason))

    def exit_process(self, code: int) -> None:
        self.exit_code = code

    def create_ring_machine(self, command: InstallRing) -> None:
        self._install(command)

    def forward_uninstall(self, ring_id: RingId, reason: UninstallReason) -> None:
        self._uninstall(ring_id, reason)

    def advance_ring(self, ring_id: RingId) -> None:
        self._advance(ring_id)

    def apply_role_config(self, command: ConfigureRole) -> None:
        self._configure_role(command)

    def arm_grant(self, command: GrantSteps) -> None:
        assert self.steps is not None
        self.steps.grant(command)

    def end_grant(self, role_id: RoleId) -> None:
        if self.steps is not None:
            self.steps.revoke(role_id)

    def reject_grant(self, command: GrantSteps, reason: StepFailure) -> None:
        self.emit(StepFailed(command.role_id, command.first_step_id, reason))

    def release_when_safe(self, device_handle: DeviceObjectHandle) -> None:
        self._release(device_handle)

    def begin_drain(self, mode: ShutdownMode) -> None:
        self._drain_mode = mode
        if mode is ShutdownMode.AbortInFlight and self.steps is not None:
            self.steps.abort(StepFailure.WorkerShuttingDown)

    def reject_install(self, command: InstallRing, reason: RingFaultReason) -> None:
        self.emit(RingFault(command.ring_id, command.edge_id, command.port_id, reason))

    def reject_role_config(self, command: ConfigureRole, reason: RoleFailure) -> None:
        self.emit(RoleFailed(command.role_id, reason))

    def _configure_role(self, command: ConfigureRole) -> None:
        assert self.bridge is not None
        kept = self.roles.get(command.role_id)
        reconfigure = getattr(kept, "reconfigure", None)
        if reconfigure is not None and isinstance(command.config, dict):
            try:
                if reconfigure(command.config, self.bridge.device):  # same stage, same file
                    footprint = footprint_of(kept)
                    if footprint is not None:
                        footprint = dataclasses.replace(footprint, reused=True)
                    self.emit(RoleConfigured(command.role_id, footprint))
                    return
            except RoleConfigError:
                pass  # the fresh build below reports what is wrong with the config
        try:
            self.roles[command.role_id] = build_role(command.config, self.bridge.device)
        except RoleConfigError as exc:
            log.warning("role %s: %s", int(command.role_id), exc)
            self.emit(RoleFailed(command.role_id, RoleFailure.ConfigInvalid))
        except MemoryError:
            self.emit(RoleFailed(command.role_id, RoleFailure.DeviceOutOfMemory))
        except Exception as exc:  # a role factory's own failure (tinygrad, weights)
            log.warning("role %s: %s: %s", int(command.role_id), type(exc).__name__, exc)
            self.emit(RoleFailed(command.role_id, RoleFailure.TinygradError))
        else:
            self.emit(RoleConfigured(command.role_id,
                                     footprint_of(self.roles[command.role_id])))
            self.emit.flush()  # the answer first; then the role's objects leave the
            heap.settle(thaw=kept is not None)  # collector's scans (swactor.heap)

    def _install(self, command: InstallRing) -> None:
        assert self.arena is not None and self.bridge is not None
        if command.ring_id in self.rings:
            self.emit(
                RingFault(command.ring_id, command.edge_id, command.port_id,
                          RingFaultReason.RingStateInvalid)
            )  # fmt: skip
            return
        kind = IngressRing if command.direction is RingDirection.Ingress else EgressRing
        ring = kind(command, self.arena, self.bridge, self._ring_emit, self.faults)
        self.rings[command.ring_id] = ring
        ring.open_ring()  # the step whose outcome the InstallRing guard reads
        ring.feed(command)  # both ring tables take the InstallRing command itself
        self._forget_if_done(command.ring_id)

    def _uninstall(self, ring_id: RingId, reason: UninstallReason) -> None:
        ring = self.rings.get(ring_id)
        if ring is None:
            log.info("UninstallRing for unknown ring %d", int(ring_id))
            return
        if isinstance(ring, IngressRing):
            if self.steps is not None:
                self.steps.ring_gone(ring_id)  # its grant ends; its objects are dropped
            ring.feed(ir.UninstallRing(ring_id, reason))
        else:
            ring.feed(er.UninstallRing(ring_id, reason))
        self._forget_if_done(ring_id)

    def _advance(self, ring_id: RingId) -> None:
        ring = self.rings.get(ring_id)
        if ring is None:
            return  # a stale hint for a ring already uninstalled
        if isinstance(ring, IngressRing):
            if ring.machine.state in (ir.State.NeedHeader, ir.State.NeedPayload):
                ring.feed(ir.RingReadable(ring_id))
        elif ring.machine.state in _EGRESS_WAITING:
            ring.feed(er.RingWritable(ring_id))

    def _forget_if_done(self, ring_id: RingId) -> None:
        ring = self.rings.get(ring_id)
        if ring is not None and ring.done:
            del self.rings[ring_id]
            if not self.rings:  # the run's last ring is gone: a run boundary
                self.emit.flush()  # its answer first: the node's teardown waits for it
                heap.release()

    def _release(self, handle: DeviceObjectHandle) -> None:
        assert self.bridge is not None
        if self.steps is not None:
            self.steps.forget(handle)
        try:
            self.bridge.release(handle)
        except InvalidHandle as exc:
            reason = ReleaseFailure.StaleGeneration if exc.stale else ReleaseFailure.UnknownHandle
            self.emit(ReleaseFailed(handle, reason))
            return
        self.emit(DeviceObjectReleased(handle))

    def _continue_drain(self) -> None:
        assert self._drain_mode is not None
        if self.steps is not None:
            self.steps.revoke_all()  # no new step starts
        if self.steps is not None and not self.steps.idle:
            return  # Graceful: the running step finishes (it may wait for ring space)
        for ring_id in list(self.rings):
            self._uninstall(ring_id, UninstallReason.WorkerShutdown)
        if not self.rings:
            reason = (
                WorkerStoppedReason.Graceful
                if self._drain_mode is ShutdownMode.Graceful
                else WorkerStoppedReason.AbortInFlight
            )
            self._drain_mode = None
            self.feed(wp.DrainComplete(reason))

