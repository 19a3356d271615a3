"""The StageHost gives every run a fresh StageController and refuses what it must (§4, §38).

A real actor runtime; the host is addressed the way the node's control channel and
GpuWorkerCtl address it; the fake ports record port calls and reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from swactor import wire
from swactor.actors import ActorRef, Runtime
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_host import (
    REFUSED_KEPT,
    HostMail,
    PreloadOutcome,
    PreloadRequest,
    StageHost,
    StageHostConfig,
    StageHostState,
    StopRunRequest,
)
from swactor.node.stage_ports import StageOutcome
from swactor.node.worker_ctl import WorkerCrashed, WorkerRoutes
from swactor.wire import (
    Component,
    EdgeReady,
    NodeId,
    ObjectId,
    ProvisionStage,
    RunFaultReason,
    RunId,
    Sequence,
    StageIndex,
    StepId,
)
from tests.node.fake_stage_ports import FakeStagePorts
from tests.node.stage_rig import IN_RING, OUT_RING, make_plan, provision_of

ORCHESTRATOR = NodeId(1000)
NODE = NodeId(2)  # stage 1 of the synthetic 3-node plan


class Host:
    def __init__(self, ref: ActorRef[HostMail], ports: FakeStagePorts, state: StageHostState,
                 done: asyncio.Queue[StageOutcome]) -> None:
        self.ref, self.ports, self.state, self.done = ref, ports, state, done

    async def settle(self) -> None:
        for _ in range(30):
            await asyncio.sleep(0)

    async def serve_run(self, provision: ProvisionStage, steps: int) -> StageOutcome:
        """Provision, make ready, run `steps` steps, stop; the stage's outcome."""
        ports, ref = self.ports, self.ref
        ready_before = len(ports.reported(orun.StageReady))
        ref.tell(scm.ProvisionStage(ORCHESTRATOR, provision))
        await ports.until(lambda: self.state.active_run == provision.run_id)
        ref.tell(EdgeReady(provision.inbound.edge_id, IN_RING))
        ref.tell(EdgeReady(provision.outbound.edge_id, OUT_RING))
        ref.tell(scm.WeightsReady())
        ref.tell(wire.RoleConfigured(provision.runtime.role_id))
        await ports.until(lambda: len(ports.reported(orun.StageReady)) == ready_before + 1)
        grant = ports.of("grant_steps")[-1][1]
        assert isinstance(grant, wire.GrantSteps)
        assert grant.input.sequence == 0, "every run starts again at sequence 0"
        extent = provision.inbound.object_spec.alignment
        for k in range(steps):
            before = ports.event_names().count("step_completed")
            now = time.monotonic_ns()
            record = wire.StepRecord(Sequence(k), ObjectId(k + 1), extent, ObjectId(k + 1),
                                     extent, now, now, now, now)
            ref.tell(wire.StepCompleted(grant.role_id, StepId(grant.first_step_id + k),
                                        record))
            await ports.until(recorded(ports, before + 1))
        ref.tell(StopRunRequest(ORCHESTRATOR, provision.run_id, provision.stage_index))
        ref.tell(scm.EdgeStopped(provision.inbound.edge_id, True))
        ref.tell(scm.EdgeStopped(provision.outbound.edge_id, True))
        outcome = await asyncio.wait_for(self.done.get(), 5)
        await self.settle()
        return outcome


def count_is(ports: FakeStagePorts, kind: str, n: int) -> Callable[[], bool]:
    return lambda: len(ports.of(kind)) == n


def recorded(ports: FakeStagePorts, n: int) -> Callable[[], bool]:
    """`n` steps recorded (step_completed emitted)."""
    return lambda: ports.event_names().count("step_completed") == n


def run_host(body: Callable[[Host], Awaitable[None]],
             routes: WorkerRoutes | None = None) -> None:
    async def main() -> None:
        async with Runtime("node") as runtime:
            ports, state = FakeStagePorts(), StageHostState()
            done: asyncio.Queue[StageOutcome] = asyncio.Queue()
            ref = runtime.spawn(lambda: StageHost(
                StageHostConfig(NODE, ORCHESTRATOR, stopping_grace_s=5.0), ports, state,
                done.put_nowait, routes,
            ), "stage-host")
            if routes is not None:
                routes.stage_controllers = [ref]
            await body(Host(ref, ports, state, done))

    asyncio.run(asyncio.wait_for(main(), timeout=20))


def test_two_runs_back_to_back_each_with_a_fresh_controller() -> None:
    first, second = provision_of(make_plan(RunId(7)), 1), provision_of(make_plan(RunId(8)), 1)

    async def body(host: Host) -> None:
        outcome = await host.serve_run(first, steps=3)
        assert (outcome.run_id, outcome.clean, outcome.steps_completed) == (RunId(7), True, 3)
        assert host.state.active_run is None
        again = await host.serve_run(second, steps=2)
        assert (again.run_id, again.clean, again.steps_completed) == (RunId(8), True, 2)
        assert [o.run_id for o in host.state.history] == [RunId(7), RunId(8)]
        assert host.state.retired_runs == {RunId(7), RunId(8)}
        assert list(host.ports.reported(orun.StageStopped)) == [
            orun.StageStopped(StageIndex(1), True)] * 2
        assert host.ports.reported(orun.StageFault) == []
        assert len(host.ports.of("reset_role")) == 2, "each run resets the role"
        grants = [c[1] for c in host.ports.of("grant_steps")
                  if isinstance(c[1], wire.GrantSteps)]
        assert len(grants) == 2
        # each run's step ids (first_step_id + k) come from a range no other run uses
        assert grants[1].first_step_id - grants[0].first_step_id >= 1 << 32

    run_host(body)


def test_a_finished_run_cannot_be_provisioned_again() -> None:
    provision = provision_of(make_plan(RunId(7)), 1)

    async def body(host: Host) -> None:
        await host.serve_run(provision, steps=1)
        calls = len(host.ports.calls)
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, provision))
        await host.ports.until(lambda: bool(host.ports.reported(orun.StageFault)))
        assert host.ports.reported(orun.StageFault) == [orun.StageFault(
            StageIndex(1), RunFaultReason.ProvisioningRejected, Component.StageController)]
        assert "already ran on this node" in host.state.refused[-1]
        assert len(host.ports.calls) == calls and host.state.active_run is None

    run_host(body)


def test_a_busy_node_refuses_another_run_and_a_stranger_cannot_occupy_it() -> None:
    mine, other = provision_of(make_plan(RunId(7)), 1), provision_of(make_plan(RunId(9)), 1)

    async def body(host: Host) -> None:
        host.ref.tell(scm.ProvisionStage(NodeId(666), mine))
        await host.ports.until(lambda: len(host.ports.reports) == 1)
        assert host.ports.reports[0][0] == 666
        assert host.state.active_run is None and host.ports.calls == []
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, mine))
        await host.ports.until(lambda: len(host.ports.calls) == 4)
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, other))
        await host.ports.until(lambda: len(host.ports.reports) == 2)
        assert host.ports.reports[1] == (1000, 9, orun.StageFault(
            StageIndex(1), RunFaultReason.ProvisioningRejected, Component.StageController))
        assert "node busy with run 7" in host.state.refused[-1]
        assert host.state.active_run == RunId(7) and len(host.ports.calls) == 4

    run_host(body)


def test_stop_run_authority_and_unknown_runs() -> None:
    provision = provision_of(make_plan(RunId(7)), 1)

    async def body(host: Host) -> None:
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, provision))
        await host.ports.until(lambda: len(host.ports.calls) == 4)
        host.ref.tell(StopRunRequest(NodeId(666), RunId(7), StageIndex(1)))
        await host.settle()
        assert host.ports.of("stop_edges") == [], "a stranger cannot stop the run"
        assert "not the trusted orchestrator" in host.state.refused[-1]
        host.ref.tell(StopRunRequest(ORCHESTRATOR, RunId(12), StageIndex(1)))
        await host.ports.until(lambda: bool(host.ports.reported(orun.StageStopped)))
        assert host.ports.reports[-1] == (1000, 12, orun.StageStopped(StageIndex(1), True))
        assert host.ports.of("stop_edges") == [] and host.state.active_run == RunId(7)

    run_host(body)


def test_refusals_keep_the_last_lines_and_count_the_rest() -> None:
    many = REFUSED_KEPT * 4 + 3

    async def body(host: Host) -> None:
        for run in range(many):
            host.ref.tell(StopRunRequest(NodeId(666), RunId(run), StageIndex(1)))
        await host.ports.until(lambda: host.state.refused_dropped + len(host.state.refused)
                               == many)
        assert len(host.state.refused) == REFUSED_KEPT
        assert host.state.refused_dropped == many - REFUSED_KEPT
        assert f"StopRun run {many - REFUSED_KEPT} " in host.state.refused[0]
        assert f"StopRun run {many - 1} " in host.state.refused[-1]
        assert host.ports.reports == [] and host.ports.of("stop_edges") == []

    run_host(body)


def _preload(host: Host, provision: ProvisionStage,
             sender: NodeId = ORCHESTRATOR) -> asyncio.Future[PreloadOutcome]:
    answer: asyncio.Future[PreloadOutcome] = asyncio.get_running_loop().create_future()
    host.ref.tell(PreloadRequest(sender, provision, answer))
    return answer


def test_a_preload_configures_the_role_outside_any_run_and_answers_with_its_footprint() -> None:
    provision = provision_of(make_plan(RunId(7)), 1)
    role = provision.runtime.role_id
    footprint = wire.StageFootprint(10, 20, 30, 40)

    async def body(host: Host) -> None:
        answer = _preload(host, provision)
        await host.ports.until(lambda: bool(host.ports.of("configure_role")))
        assert host.ports.kinds() == ["load_weights", "configure_role"]
        assert host.state.active_run is None  # no run opened, no edge asked for
        assert not answer.done()
        host.ref.tell(wire.RoleConfigured(role, footprint))
        assert await asyncio.wait_for(answer, 5) == PreloadOutcome(True, "", footprint)
        await host.ports.until(lambda: bool(host.ports.of("reset_role")))  # location dropped
        assert host.ports.reports == []  # nothing reported as a run's stage

    run_host(body)


def test_a_failed_preload_says_why_and_busy_or_untrusted_ones_are_refused() -> None:
    provision = provision_of(make_plan(RunId(7)), 1)
    role = provision.runtime.role_id

    async def body(host: Host) -> None:
        stranger = await asyncio.wait_for(_preload(host, provision, NodeId(77)), 5)
        assert stranger == PreloadOutcome(False, "not the trusted orchestrator")
        first = _preload(host, provision)
        second = await asyncio.wait_for(_preload(host, provision), 5)
        assert second == PreloadOutcome(False, "another preload is under way")
        await host.ports.until(lambda: bool(host.ports.of("configure_role")))
        host.ref.tell(wire.RoleFailed(role, wire.RoleFailure.DeviceOutOfMemory))
        failed = await asyncio.wait_for(first, 5)
        assert not failed.ok and "DeviceOutOfMemory" in failed.detail
        # a node serving a run does not preload
        run = provision_of(make_plan(RunId(8)), 1)
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, run))
        await host.ports.until(lambda: host.state.active_run == RunId(8))
        busy = await asyncio.wait_for(_preload(host, provision), 5)
        assert busy == PreloadOutcome(False, "node busy with run 8")

    run_host(body)


def test_a_run_provisioned_during_a_preload_waits_for_it() -> None:
    spare = provision_of(make_plan(RunId(7)), 1)
    run = provision_of(make_plan(RunId(8)), 1)

    async def body(host: Host) -> None:
        answer = _preload(host, spare)
        await host.ports.until(lambda: bool(host.ports.of("configure_role")))
        host.ref.tell(scm.ProvisionStage(ORCHESTRATOR, run))
        await host.settle()
        assert host.state.active_run is None  # held: the worker is the preload's
        host.ref.tell(wire.RoleConfigured(spare.runtime.role_id))
        assert (await asyncio.wait_for(answer, 5)).ok
        await host.ports.until(lambda: host.state.active_run == RunId(8))

    run_host(body)


def test_worker_mail_reaches_the_active_controller_without_the_host_hop() -> None:
    """Given the node's WorkerRoutes, the host points them at each run's controller for
    the run's life: GpuWorkerCtl's step reports skip the host; before and after a run
    (a preload's answers) they reach the host."""
    first, second = provision_of(make_plan(RunId(7)), 1), provision_of(make_plan(RunId(8)), 1)
    routes = WorkerRoutes()
    record = wire.StepRecord(Sequence(0), ObjectId(1), 8, ObjectId(1), 8, 0, 0, 0, 0)
    step = wire.StepCompleted(first.runtime.role_id, StepId(1), record)
    crash = WorkerCrashed(wire.WorkerGeneration(1), 1, None)

    async def body(host: Host) -> None:
        assert list(routes.targets(step)) == [host.ref]
        seen: list[object] = []

        async def provisioned() -> None:
            await host.ports.until(lambda: host.state.active_run is not None)
            targets = list(routes.targets(step))
            seen.append(targets)
            assert targets != [host.ref] and len(targets) == 1
            assert list(routes.targets(crash)) == targets

        for provision, steps in ((first, 2), (second, 1)):
            watch = asyncio.ensure_future(provisioned())
            outcome = await host.serve_run(provision, steps=steps)
            await watch
            assert outcome.clean and outcome.steps_completed == steps
            assert list(routes.targets(step)) == [host.ref], "the host again, once idle"
        assert seen[0] != seen[1], "each run's own controller"

    run_host(body, routes)
