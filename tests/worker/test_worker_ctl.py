"""GpuWorkerCtl with real worker processes: start, route, kill -9 mid-step, restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from swactor.actors import Runtime
from swactor.arena import Arena
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.model import cpu_graph
from swactor.node.worker_ctl import (
    GpuWorkerCtl,
    WorkerCrashed,
    WorkerCtlConfig,
    WorkerFailedNotice,
    WorkerReadyNotice,
    WorkerReaped,
    WorkerRoutes,
)
from swactor.ring import Ring, WorkerDoorbells
from swactor.testing.worker_rig import grant, record
from swactor.wire import (
    ConfigureRole,
    DeviceObjectHandle,
    DeviceObjectReleased,
    ReleaseFailed,
    ReleaseFailure,
    RingDirection,
    RingFault,
    RingFaultReason,
    RingId,
    RingInstalled,
    RoleConfigured,
    RoleFailed,
    RoleFailure,
    RoleId,
    ShutdownMode,
    StepFailed,
    StepFailure,
    UninstallReason,
    WorkerFatalReason,
    WorkerGeneration,
)
from tests.worker.ctl_rig import Collector, install_command, take

RING = 4096


async def kill_mid_step_scenario() -> None:
    arena = Arena.create(1 << 22)
    bells = WorkerDoorbells.create()
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    ring_q: asyncio.Queue[Any] = asyncio.Queue()
    stage_q: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("node") as runtime:
        routes = WorkerRoutes(
            node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"),
            establisher=runtime.spawn(lambda: Collector(ring_q), "establisher"),
            stage_controllers=[runtime.spawn(lambda: Collector(stage_q), "stage")],
        )
        config = WorkerCtlConfig(arena.fd, arena.size, restart_backoff_s=0.05)
        ctl = runtime.spawn(
            lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells), "gpu-worker",
            mailbox_capacity=1024,
        )
        ctl.tell(gwc.StartWorker())
        first = await take(boot_q, WorkerReadyNotice)
        assert first.generation == 1
        assert first.backend == {"device": "CPU", "threads": cpu_graph.cpu_count()}

        ingress_cmd, ingress = install_command(arena, 1, RingDirection.Ingress, RING, 1 << 16)
        egress_cmd, egress = install_command(arena, 2, RingDirection.Egress, RING, 1 << 17)
        for command in (ingress_cmd, egress_cmd):
            ctl.tell(gwc.InstallRing(command))
            assert (await take(ring_q, RingInstalled)).ring_id == command.ring_id
        # The output is three rings long and nobody drains the egress ring: the grant's
        # first step is stuck mid-object when the worker is killed. (The worker serves
        # its stdin in order: once the role is configured, the grant is armed, and the
        # object is the grant's, reported by no ObjectLoaded line.)
        ctl.tell(gwc.GrantSteps(grant(1, 1)))
        ctl.tell(gwc.ConfigureRole(ConfigureRole(RoleId(1), {"kind": "echo"})))
        await take(stage_q, RoleConfigured)
        await _write(ingress, record(10, 0, os.urandom(3 * RING)), bells)
        async with asyncio.timeout(30):
            while egress.commit < RING:
                await asyncio.sleep(0.01)
        os.kill(first.pid, signal.SIGKILL)

        # The death is told first (the stage's first fault), then the grant's step in
        # flight.
        crashed = await take(stage_q, WorkerCrashed)
        assert (crashed.generation, crashed.exit_code, crashed.fatal) == (
            1, -signal.SIGKILL, None)
        failed = await take(stage_q, StepFailed)
        assert (failed.step_id, failed.reason) == (1, StepFailure.WorkerProcessExited)
        faults = [await take(ring_q, RingFault) for _ in range(2)]
        assert {f.ring_id for f in faults} == {1, 2}
        assert {f.reason for f in faults} == {RingFaultReason.WorkerProcessExited}
        assert ingress.fault_reason is egress.fault_reason is RingFaultReason.WorkerProcessExited

        # Teardown uninstalls the dead generation's rings; then the restart.
        for ring_id in (1, 2):
            ctl.tell(gwc.UninstallRing(RingId(ring_id), UninstallReason.RingFaulted))
            assert (await take(ring_q, WorkerReaped)).ring_id == ring_id
        # The next run's commands, sent while the next generation starts, are held and
        # written once it is ready (not refused: the node serves its next run).
        assert _state(runtime) in (gwc.State.Restarting, gwc.State.Spawning,
                                   gwc.State.Initializing)
        fresh_cmd, fresh = install_command(arena, 3, RingDirection.Egress, RING, 1 << 18)
        ctl.tell(gwc.InstallRing(fresh_cmd))
        ctl.tell(gwc.ConfigureRole(ConfigureRole(RoleId(1), {"kind": "echo"})))
        second = await take(boot_q, WorkerReadyNotice)
        assert second.generation == 2 and second.pid != first.pid
        assert (await take(ring_q, RingInstalled)).ring_id == 3
        await take(stage_q, RoleConfigured)

        # Handles of the old generation are refused by the new one.
        ctl.tell(gwc.ReleaseDeviceObject(DeviceObjectHandle(WorkerGeneration(1), 1)))
        assert (await take(stage_q, ReleaseFailed)).reason is ReleaseFailure.StaleGeneration
        assert fresh.commit == 0
        assert ctl.alive

        ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
        async with asyncio.timeout(30):
            while ctl.alive and _state(runtime) is not gwc.State.Stopped:
                await asyncio.sleep(0.02)
        for ring in (ingress, egress, fresh):
            ring.close()
    bells.close()
    arena.close()


async def _write(ring: Ring, data: bytes, bells: WorkerDoorbells) -> None:
    """Write `data` into an ingress ring, ringing the worker's doorbell after each
    write and waiting for space when the ring is full."""
    sent = 0
    while sent < len(data):
        n, _ = ring.write_from(memoryview(data)[sent:])
        sent += n
        bells.to_worker.notify()  # the ingress ring got bytes
        await asyncio.sleep(0.005 if n == 0 else 0)


def _state(runtime: Runtime) -> gwc.State | None:
    for ref in runtime.actors:
        actor = getattr(ref._cell, "_actor", None)  # tests only: peek at the binding
        if isinstance(actor, GpuWorkerCtl):
            return actor.state
    return None


def test_kill_9_mid_step_faults_rings_and_restarts_with_next_generation() -> None:
    asyncio.run(kill_mid_step_scenario())


async def init_failure_scenario() -> None:
    arena = Arena.create(1 << 20)
    bells = WorkerDoorbells.create()
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    ring_q: asyncio.Queue[Any] = asyncio.Queue()
    stage_q: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("node") as runtime:
        routes = WorkerRoutes(
            node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"),
            establisher=runtime.spawn(lambda: Collector(ring_q), "establisher"),
            stage_controllers=[runtime.spawn(lambda: Collector(stage_q), "stage")],
        )
        # The node requires a helper ABI the worker does not have: WorkerFatal at init.
        config = WorkerCtlConfig(arena.fd, arena.size, required_ring_helper_abi=999)
        ctl = runtime.spawn(lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells),
                            "gpu-worker",
                            mailbox_capacity=64)  # fmt: skip
        ctl.tell(gwc.StartWorker())
        failed = await take(boot_q, WorkerFailedNotice)
        assert failed.generation == 1
        assert failed.fatal is WorkerFatalReason.RingHelperAbiMismatch  # noted at init
        # Failed keeps answering every command, so no waiter hangs.
        command, ring = install_command(arena, 1, RingDirection.Ingress, RING, 1 << 16)
        ctl.tell(gwc.InstallRing(command))
        fault = await take(ring_q, RingFault)
        assert (fault.ring_id, fault.reason) == (1, RingFaultReason.WorkerProcessExited)
        handle = DeviceObjectHandle(WorkerGeneration(1), 1)
        ctl.tell(gwc.GrantSteps(grant(1, 5)))
        step_failed = await take(stage_q, StepFailed)
        assert (step_failed.step_id, step_failed.reason) == (5, StepFailure.WorkerProcessExited)
        ctl.tell(gwc.ConfigureRole(ConfigureRole(RoleId(3), {"kind": "echo"})))
        assert (await take(stage_q, RoleFailed)).reason is RoleFailure.WorkerProcessExited
        ctl.tell(gwc.ReleaseDeviceObject(handle))
        assert (await take(stage_q, DeviceObjectReleased)).device_handle == handle
        ctl.tell(gwc.UninstallRing(RingId(1), UninstallReason.EdgeStopped))
        assert (await take(ring_q, WorkerReaped)).ring_id == 1
        ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
        async with asyncio.timeout(10):
            while _state(runtime) is not gwc.State.Stopped:
                await asyncio.sleep(0.02)
        ring.close()
    bells.close()
    arena.close()


def test_init_failure_reports_failed_and_answers_every_command() -> None:
    asyncio.run(init_failure_scenario())


async def init_timeout_scenario() -> None:
    arena = Arena.create(1 << 16)
    bells = WorkerDoorbells.create()
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("node") as runtime:
        routes = WorkerRoutes(node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"))
        silent = (sys.executable, "-c",  # says so on stderr, never answers
                  "import sys; print('never answers', file=sys.stderr, flush=True); "
                  "print(file=sys.stderr, flush=True); sys.stdin.read()")
        config = WorkerCtlConfig(arena.fd, arena.size, argv=silent, init_timeout_s=0.5,
                                 kill_grace_s=0.1)  # fmt: skip
        ctl = runtime.spawn(lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells),
                            "gpu-worker",
                            mailbox_capacity=64)  # fmt: skip
        ctl.tell(gwc.StartWorker())
        failed = await take(boot_q, WorkerFailedNotice, timeout=30)
        assert failed.generation == 1
        assert failed.stderr_tail == "never answers"  # its last line that says something
        assert failed.fatal is None
        assert _state(runtime) is gwc.State.Failed
    bells.close()
    arena.close()


def test_init_timeout_kills_the_silent_worker_and_reports_failed() -> None:
    asyncio.run(init_timeout_scenario())


async def restart_window_scenario() -> None:
    arena = Arena.create(1 << 20)
    bells = WorkerDoorbells.create()
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    now = [0.0]  # the restart budget's clock: the test moves it, not the machine's load
    async with Runtime("node") as runtime:
        routes = WorkerRoutes(node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"))
        # One restart per 1.5 s window: a crash after the window restarts again (a node
        # that lives for weeks survives a crash now and then); two inside it fail.
        config = WorkerCtlConfig(arena.fd, arena.size, restart_backoff_s=0.05,
                                 max_restarts=1, restart_window_s=1.5)
        ctl = runtime.spawn(lambda: GpuWorkerCtl(config, routes, arena, clock=lambda: now[0],
                                                doorbells=bells),
                            "gpu-worker", mailbox_capacity=64)  # fmt: skip
        ctl.tell(gwc.StartWorker())
        ready = await take(boot_q, WorkerReadyNotice)
        for generation in (2, 3):
            now[0] += 1.6  # the previous restart has left the window
            os.kill(ready.pid, signal.SIGKILL)
            ready = await take(boot_q, WorkerReadyNotice)
            assert ready.generation == generation
        now[0] += 1.4  # the window still holds generation 3's restart
        os.kill(ready.pid, signal.SIGKILL)
        failed = await take(boot_q, WorkerFailedNotice)
        assert failed.generation == 3
        assert _state(runtime) is gwc.State.Failed
        ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
        async with asyncio.timeout(10):
            while _state(runtime) is not gwc.State.Stopped:
                await asyncio.sleep(0.02)
    bells.close()
    arena.close()


def test_the_restart_budget_is_a_window_not_a_lifetime() -> None:
    asyncio.run(restart_window_scenario())


async def dies_while_draining_scenario() -> None:
    arena = Arena.create(1 << 22)
    bells = WorkerDoorbells.create()
    boot_q: asyncio.Queue[Any] = asyncio.Queue()
    ring_q: asyncio.Queue[Any] = asyncio.Queue()
    stage_q: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("node") as runtime:
        routes = WorkerRoutes(
            node_boot=runtime.spawn(lambda: Collector(boot_q), "boot"),
            establisher=runtime.spawn(lambda: Collector(ring_q), "establisher"),
            stage_controllers=[runtime.spawn(lambda: Collector(stage_q), "stage")],
        )
        config = WorkerCtlConfig(arena.fd, arena.size, stop_grace_s=60.0)
        ctl = runtime.spawn(
            lambda: GpuWorkerCtl(config, routes, arena, doorbells=bells), "gpu-worker",
            mailbox_capacity=1024,
        )
        ctl.tell(gwc.StartWorker())
        ready = await take(boot_q, WorkerReadyNotice)
        ingress_cmd, ingress = install_command(arena, 1, RingDirection.Ingress, RING, 1 << 16)
        egress_cmd, egress = install_command(arena, 2, RingDirection.Egress, RING, 1 << 17)
        for command in (ingress_cmd, egress_cmd):
            ctl.tell(gwc.InstallRing(command))
            assert (await take(ring_q, RingInstalled)).ring_id == command.ring_id
        # A step stuck mid-object (nobody drains the egress ring): a graceful stop waits
        # for it, so the worker is still draining, with no WorkerStopped, when it dies.
        ctl.tell(gwc.GrantSteps(grant(1, 1)))
        ctl.tell(gwc.ConfigureRole(ConfigureRole(RoleId(1), {"kind": "echo"})))
        await take(stage_q, RoleConfigured)
        await _write(ingress, record(10, 0, os.urandom(3 * RING)), bells)
        async with asyncio.timeout(30):
            while egress.commit < RING:
                await asyncio.sleep(0.01)
        ctl.tell(gwc.ShutdownWorker(ShutdownMode.Graceful))
        async with asyncio.timeout(10):
            while _state(runtime) is not gwc.State.Stopping:
                await asyncio.sleep(0.01)
        os.kill(ready.pid, signal.SIGKILL)

        # §31 waits for WorkerStopped and the exit: an exit alone is a death while
        # draining, so the step is answered and the rings faulted, then reaped.
        failed = await take(stage_q, StepFailed, timeout=20)
        assert (failed.step_id, failed.reason) == (1, StepFailure.WorkerProcessExited)
        faults = [await take(ring_q, RingFault, timeout=20) for _ in range(2)]
        assert {(f.ring_id, f.reason) for f in faults} == {
            (1, RingFaultReason.WorkerProcessExited), (2, RingFaultReason.WorkerProcessExited)}
        reaped = [await take(ring_q, WorkerReaped, timeout=20) for _ in range(2)]
        assert {r.ring_id for r in reaped} == {1, 2}
        assert ingress.fault_reason is egress.fault_reason is RingFaultReason.WorkerProcessExited
        assert _state(runtime) is gwc.State.Stopped
        for ring in (ingress, egress):
            ring.close()
    bells.close()
    arena.close()


def test_a_worker_that_dies_while_draining_fails_its_steps_and_rings() -> None:
    asyncio.run(dies_while_draining_scenario())
