"""The StageController binding drives the stage_controller machine through fake ports (§14).

Each test starts a real actor runtime, provisions one stage of a real 3-stage plan, and
plays the peers' mail (orchestrator, edge actors, weight loader, GpuWorkerCtl's worker
events) into the controller; the fake ports record what it did and what it reported.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from swactor import wire
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import StageControllerConfig, output_extent
from swactor.node.stage_ports import WeightsFetched
from swactor.node.worker_ctl import WorkerCrashed
from swactor.wire import (
    Component,
    EdgeReady,
    NodeId,
    ObjectFailure,
    RunFaultError,
    RunFaultReason,
    RunId,
    Sequence,
    StepFailure,
    WorkerFatalReason,
    WorkerGeneration,
)
from tests.node.stage_rig import (
    HIDDEN,
    IN_RING,
    OUT_RING,
    PROMPT,
    RUN,
    StageRig,
    handle,
    make_plan,
    provision_of,
    run_stage,
)

F32 = 4
STEP_EVENTS = ("object_loaded", "execute_step_started", "object_produced", "step_completed")


def faults(rig: StageRig) -> list[tuple[int, RunFaultReason, Component]]:
    return [
        (int(m.stage_index), m.reason, m.component)
        for m in rig.ports.reported(orun.StageFault)
        if isinstance(m, orun.StageFault)
    ]


def stopped(rig: StageRig) -> list[tuple[int, bool]]:
    return [
        (int(m.stage_index), m.clean)
        for m in rig.ports.reported(orun.StageStopped)
        if isinstance(m, orun.StageStopped)
    ]


def assert_legal_order(names: list[str], steps: int) -> None:
    """A stage's §40 events of one clean run, in the only order this binding allows."""
    pattern = (
        "weights_download_started (edge_provision_started ){2}"
        "((edge_ready|weights_downloaded) ){3}weights_loaded stage_ready "
        + f"(object_loaded execute_step_started object_produced step_completed ){{{steps}}}"
        + "stage_stopped"
    )
    joined = " ".join(names)
    assert re.fullmatch(pattern, joined), f"{joined!r} does not match {pattern!r}"


# -- the happy path -------------------------------------------------------------------------


def test_provision_ready_steps_stop() -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.calls) == 4)
        assert rig.state() is scm.State.Preparing
        assert sorted(rig.ports.kinds()) == [
            "configure_role", "establish_inbound", "establish_outbound", "load_weights",
        ]
        assert rig.ports.of("establish_inbound") == [("establish_inbound", int(rig.inbound))]
        assert rig.ports.of("load_weights") == [("load_weights", 2, 4)]  # stage 1 of 6 blocks
        rig.ref.tell(EdgeReady(rig.inbound, IN_RING))
        rig.ref.tell(EdgeReady(rig.outbound, OUT_RING))
        rig.ref.tell(WeightsFetched(1234))
        rig.ref.tell(scm.WeightsReady())
        await rig.settle()
        assert rig.state() is scm.State.Preparing, "not ready before the role is configured"
        assert rig.ports.reported(orun.StageReady) == []
        rig.ref.tell(wire.RoleConfigured(rig.provision.runtime.role_id))
        await rig.ports.until(lambda: bool(rig.ports.reported(orun.StageReady)))
        assert rig.ports.reports[0] == (1000, int(RUN), orun.StageReady(rig.provision.stage_index))
        assert rig.state() is scm.State.Ready

        # one standing grant, issued with StageReady: sequence 0 on, one step at a time
        (call,) = rig.ports.of("grant_steps")
        grant = call[1]
        assert isinstance(grant, wire.GrantSteps)
        assert grant.role_id == rig.provision.runtime.role_id
        assert grant.input == wire.AwaitedInput(
            rig.provision.runtime.input_port, IN_RING, Sequence(0),
            rig.provision.inbound.object_spec.alignment)
        out = grant.output
        assert (out.ring_id, out.sequence, out.object_id) == (OUT_RING, 0, 1)
        assert out.port_id == rig.provision.runtime.output_port
        assert (out.extent, out.per_input_row) == (HIDDEN * F32, True)  # per input row
        for k in range(4):
            tokens = len(PROMPT) if k == 0 else 1
            assert await rig.step(k, tokens) == grant.first_step_id + k
            assert rig.state() is scm.State.Ready
        assert len(rig.ports.of("grant_steps")) == 1, "no command per step"
        # the four events of each step carry the worker's times, in step order
        steps = [json.loads(x) for x in rig.ports.lines
                 if json.loads(x)["event"] in STEP_EVENTS]
        assert [(e["event"], e["sequence"]) for e in steps] == [
            (name, k) for k in range(4) for name in STEP_EVENTS]
        assert [e["mono"] for e in steps] == [
            rig.t0 + 10_000 * k + 1_000 * i for k in range(4) for i in range(4)]
        assert steps[0]["detail"] == {"extent": len(PROMPT) * HIDDEN * F32}  # rows in
        assert steps[2]["detail"] == {"extent": len(PROMPT) * HIDDEN * F32}
        assert rig.ports.of("revoke_steps") == []

        await rig.stop_run()
        role = int(rig.provision.runtime.role_id)
        assert rig.ports.of("revoke_steps") == [("revoke_steps", role)]
        assert rig.ports.of("reset_role") == [("reset_role", role)]
        assert rig.state() is scm.State.Stopping
        outcome = await rig.edges_stopped()
        assert stopped(rig) == [(1, True)]
        assert faults(rig) == []
        assert outcome.stopped and outcome.clean and outcome.steps_completed == 4
        assert outcome.run_id == RUN and outcome.provisioned
        assert_legal_order(rig.ports.event_names(), steps=4)

    run_stage(body)


def test_a_step_that_completes_after_stop_run_is_recorded() -> None:
    """The revocation stops further steps; one already started still completes, its
    output went out, so its events are emitted while the stage stops."""

    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        await rig.step(0, len(PROMPT))
        await rig.stop_run()
        await rig.step(1)
        outcome = await rig.edges_stopped()
        assert outcome.clean and outcome.steps_completed == 2
        assert stopped(rig) == [(1, True)]
        assert_legal_order(rig.ports.event_names(), steps=2)

    run_stage(body)


def test_stage_ready_carries_the_workers_footprint() -> None:
    """The footprint the worker's RoleConfigured measured reaches the StageReady report
    (for the orchestrator to print) and the stage_ready event's byte-count fields."""
    footprint = wire.StageFootprint(weights_bytes=81 << 20, kv_cache_bytes=3 << 20,
                                    rss_bytes=400 << 20, file_bytes=80 << 20)

    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.calls) == 4)
        rig.ref.tell(EdgeReady(rig.inbound, IN_RING))
        rig.ref.tell(EdgeReady(rig.outbound, OUT_RING))
        rig.ref.tell(scm.WeightsReady())
        rig.ref.tell(wire.RoleConfigured(rig.provision.runtime.role_id, footprint))
        await rig.ports.until(lambda: bool(rig.ports.reported(orun.StageReady)))
        ready = [i for i, (_, _, m) in enumerate(rig.ports.reports)
                 if isinstance(m, orun.StageReady)]
        assert [rig.ports.footprints[i] for i in ready] == [footprint]
        (line,) = [json.loads(x) for x in rig.ports.lines if '"stage_ready"' in x]
        assert {k: line[k] for k in ("weights_bytes", "kv_cache_bytes", "rss_bytes",
                                     "file_bytes")} == {
            "weights_bytes": 81 << 20, "kv_cache_bytes": 3 << 20, "rss_bytes": 400 << 20,
            "file_bytes": 80 << 20}
        await rig.stop_run()
        await rig.edges_stopped()

    run_stage(body)


@pytest.mark.parametrize(("stage", "tokens", "expected"), [
    (0, 5, 5 * HIDDEN * F32),   # token ids in, activation rows out
    (1, 5, 5 * HIDDEN * F32),   # rows in, rows out
    (1, 1, HIDDEN * F32),
    (2, 5, 4),                  # the last stage writes one u32 token id
])
def test_output_extent_per_stage_kind(stage: int, tokens: int, expected: int) -> None:
    provision = provision_of(make_plan(), stage)
    row = 4 if stage == 0 else HIDDEN * F32
    assert output_extent(provision, tokens * row) == expected


# -- provisioning authority -----------------------------------------------------------------


def test_provision_from_another_node_is_rejected_and_reported() -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage(sender=NodeId(666))
        await rig.ports.until(lambda: bool(rig.ports.reports))
        assert rig.ports.reports == [(666, int(RUN), orun.StageFault(
            rig.provision.stage_index, RunFaultReason.ProvisioningRejected,
            Component.StageController))]
        assert rig.ports.calls == [], "nothing configured, loaded or established"
        assert rig.state() is scm.State.Unprovisioned
        assert "not the trusted orchestrator" in rig.controller.outcome.rejected_provisions[0]
        # the trusted orchestrator can still provision it, exactly once
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.calls) == 4)
        assert rig.state() is scm.State.Preparing
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.reports) == 2)
        assert rig.ports.reports[-1][2] == orun.StageFault(
            rig.provision.stage_index, RunFaultReason.ProvisioningRejected,
            Component.StageController)
        assert rig.state() is scm.State.Preparing
        assert len(rig.ports.calls) == 4

    run_stage(body)


def test_provision_valid_only_reads_what_the_binding_found() -> None:
    """The guard is a pure read of the ledger: what is wrong with a ProvisionStage is
    worked out before it is fed and recorded by RejectProvision, once, however often
    the guard is asked."""
    async def body(rig: StageRig) -> None:
        await rig.provision_stage(sender=NodeId(666))
        await rig.ports.until(lambda: bool(rig.ports.reports))
        rejected = rig.controller.outcome.rejected_provisions
        assert len(rejected) == 1 and "not the trusted orchestrator" in rejected[0]
        event = scm.ProvisionStage(NodeId(666), rig.provision)
        assert rig.controller.provision_valid(event) is False
        assert rig.controller.provision_valid(event) is False
        assert len(rejected) == 1, rejected
        # a second ProvisionStage is refused by the table's "*" row, which says why
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.calls) == 4)
        await rig.provision_stage()
        await rig.ports.until(lambda: len(rig.ports.reports) == 2)
        assert len(rejected) == 2 and "already provisioned" in rejected[1], rejected

    run_stage(body)


@pytest.mark.parametrize(("config_change", "phrase"), [
    ("active_run", "not this node's active run"),
    ("retired", "already ran on this node"),
])
def test_provision_for_a_run_this_node_does_not_serve_is_rejected(
    config_change: str, phrase: str
) -> None:
    plan = make_plan()
    node = plan.stages[1].node_id
    config = StageControllerConfig(
        node_id=node, orchestrator=plan.orchestrator_node,
        active_run=RunId(99) if config_change == "active_run" else None,
        retired_runs=frozenset({RUN}) if config_change == "retired" else frozenset(),
    )

    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        await rig.ports.until(lambda: bool(rig.ports.reports))
        assert faults(rig) == [(1, RunFaultReason.ProvisioningRejected,
                                Component.StageController)]
        assert rig.state() is scm.State.Unprovisioned
        assert phrase in rig.controller.outcome.rejected_provisions[0]

    run_stage(body, config=config)


def test_last_stage_must_send_tokens_to_the_orchestrator() -> None:
    plan = make_plan()
    # this node trusts node 2 as orchestrator, but the plan's tokens go to node 1000
    config = StageControllerConfig(node_id=NodeId(3), orchestrator=NodeId(2))

    async def body(rig: StageRig) -> None:
        await rig.provision_stage(sender=NodeId(2))
        await rig.ports.until(lambda: bool(rig.ports.reports))
        assert rig.state() is scm.State.Unprovisioned
        assert "tokens go to node 1000" in rig.controller.outcome.rejected_provisions[0]
        assert plan.orchestrator_node == 1000

    run_stage(body, stage=2, config=config)


# -- setup failures -------------------------------------------------------------------------


def test_weights_failure_faults_the_stage_then_stop_is_clean() -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        rig.ref.tell(EdgeReady(rig.inbound, IN_RING))
        rig.ref.tell(scm.WeightsFailed(RunFaultReason.WeightDownloadFailed))
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.WeightDownloadFailed, Component.ModelLoader)]
        assert rig.state() is scm.State.Faulted
        # late setup news changes nothing; the stage never reports ready
        rig.ref.tell(wire.RoleConfigured(rig.provision.runtime.role_id))
        rig.ref.tell(EdgeReady(rig.outbound, OUT_RING))
        rig.ref.tell(scm.WeightsReady())
        await rig.settle()
        assert rig.state() is scm.State.Faulted
        assert rig.ports.reported(orun.StageReady) == []
        await rig.stop_run()
        outcome = await rig.edges_stopped()
        assert stopped(rig) == [(1, True)]
        assert outcome.fault is not None
        assert outcome.fault.reason is RunFaultReason.WeightDownloadFailed
        names = rig.ports.event_names()
        assert "stage_ready" not in names and "weights_loaded" not in names
        assert names[-1] == "stage_stopped"

    run_stage(body)


def test_load_weights_port_error_keeps_its_reason() -> None:
    async def body(rig: StageRig) -> None:
        rig.ports.fail["load_weights"] = RunFaultError(
            RunFaultReason.WeightBindFailed, "device allocation")
        await rig.provision_stage()
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.WeightBindFailed, Component.ModelLoader)]

    run_stage(body)


def test_edge_establishment_failure_is_an_edge_fault() -> None:
    async def body(rig: StageRig) -> None:
        rig.ports.fail["establish_outbound"] = RunFaultError(
            RunFaultReason.RingRequestOversized, "ring too big")
        await rig.provision_stage()
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.RingRequestOversized,
                                Component.EdgeEstablisher)]

    run_stage(body)


def test_role_failure_is_reported_as_weight_load_failure() -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        rig.ref.tell(wire.RoleFailed(rig.provision.runtime.role_id,
                                     wire.RoleFailure.DeviceOutOfMemory))
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.WeightLoadFailed, Component.Worker)]

    run_stage(body)


# -- steps ----------------------------------------------------------------------------------


def test_object_lines_are_not_run_work() -> None:
    """Objects are the grant's: the worker runs and frees them and reports each step
    once; an ObjectLoaded / ObjectProduced line (one written before the grant reached
    the worker) starts nothing, releases nothing and is not an event of its own."""
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        spec = rig.provision.inbound.object_spec
        rig.ref.tell(wire.ObjectLoaded(IN_RING, rig.inbound, rig.provision.runtime.input_port,
                                       wire.ObjectId(1), Sequence(0), spec.alignment,
                                       handle(0)))
        rig.ref.tell(wire.ObjectProduced(OUT_RING, rig.outbound,
                                         rig.provision.runtime.output_port, wire.ObjectId(1),
                                         Sequence(0), HIDDEN * F32))
        await rig.settle()
        assert rig.state() is scm.State.Ready and not faults(rig)
        assert rig.ports.kinds().count("grant_steps") == 1
        assert "object_loaded" not in rig.ports.event_names()
        assert rig.controller.outcome.rejected_events == []

    run_stage(body)


def test_a_step_of_no_grant_of_this_run_is_dropped() -> None:
    """Only the steps of this run's grant count: a late answer about another run's
    step id (another controller's range) or another role changes nothing."""
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        role = rig.provision.runtime.role_id
        stray = wire.StepCompleted(role, wire.StepId(int(rig.step_of(0)) + (1 << 32)),
                                   rig.record(0))
        rig.ref.tell(stray)
        rig.ref.tell(wire.StepCompleted(wire.RoleId(int(role) + 1), rig.step_of(0),
                                        rig.record(0)))
        rig.ref.tell(wire.StepFailed(wire.RoleId(int(role) + 1), rig.step_of(0),
                                     StepFailure.TinygradError))
        await rig.settle()
        assert rig.state() is scm.State.Ready and not faults(rig)
        assert rig.controller.outcome.steps_completed == 0
        assert "step_completed" not in rig.ports.event_names()

    run_stage(body)


def test_step_failure_faults_and_revokes_the_grant() -> None:
    """A failed step (the worker's sequence gate answers InvalidInputHandle for an
    object out of order) is the stage's fault; the grant is revoked at once, and a
    step that still completes is recorded; the stop is clean."""
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        await rig.step(0, len(PROMPT))
        rig.ref.tell(wire.StepFailed(rig.provision.runtime.role_id, rig.step_of(1),
                                     StepFailure.InvalidInputHandle))
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.StepFailed, Component.Worker)]
        assert rig.ports.of("revoke_steps") == [
            ("revoke_steps", int(rig.provision.runtime.role_id))]
        assert rig.state() is scm.State.Faulted
        await rig.stop_run()
        assert len(rig.ports.of("revoke_steps")) == 1, "revoked once"
        outcome = await rig.edges_stopped()
        assert outcome.clean and stopped(rig) == [(1, True)]
        assert outcome.fault is not None and outcome.fault.reason is RunFaultReason.StepFailed

    run_stage(body)


def test_object_failure_on_the_inbound_edge_is_an_edge_fault() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        rig.ref.tell(wire.ObjectFailed(IN_RING, rig.inbound, rig.provision.runtime.input_port,
                                       None, None, ObjectFailure.EofMidObject))
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.EofMidObject, Component.IngressParser)]
        assert len(rig.ports.of("revoke_steps")) == 1

    run_stage(body)


def test_worker_crash_faults_the_stage() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        await rig.step(0, len(PROMPT))
        rig.ref.tell(WorkerCrashed(WorkerGeneration(1), -9))
        await rig.ports.until(lambda: bool(faults(rig)))
        assert faults(rig) == [(1, RunFaultReason.WorkerCrashed, Component.WorkerCtl)]
        await rig.stop_run()
        outcome = await rig.edges_stopped()
        assert rig.ports.of("revoke_steps") == [], "the grant died with the worker"
        assert outcome.clean

    run_stage(body)


def test_worker_fatal_is_reported_as_worker_fatal_before_its_step_failure() -> None:
    """GpuWorkerCtl tells of the death (with the fatal reason) before it fails the dead
    generation's in-flight step: the stage's one fault is WorkerFatal, not StepFailed."""
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        rig.ref.tell(WorkerCrashed(WorkerGeneration(1), 1, WorkerFatalReason.UnhandledException))
        rig.ref.tell(wire.StepFailed(rig.provision.runtime.role_id, rig.step_of(0),
                                     StepFailure.WorkerProcessExited))
        await rig.ports.until(lambda: bool(faults(rig)))
        await rig.stop_run()
        await rig.edges_stopped()
        assert faults(rig) == [(1, RunFaultReason.WorkerFatal, Component.WorkerCtl)]

    run_stage(body)


# -- teardown -------------------------------------------------------------------------------


def test_stop_run_right_after_provisioning_waits_for_the_edge_establishments() -> None:
    """StopRun queued behind ProvisionStage (a rejection elsewhere in the run): the
    edges are stopped only after both establishments ended, so no lease they take is
    left behind (found by the fault matrix: 'provisioning rejected' left 2 leases)."""
    async def body(rig: StageRig) -> None:
        rig.ports.establish_delay_s = 0.2
        rig.ref.tell(scm.ProvisionStage(rig.orchestrator, rig.provision))
        await rig.stop_run()
        kinds = [str(call[0]) for call in rig.ports.calls]
        assert kinds.index("stop_edges") > kinds.index("establish_inbound"), kinds
        assert kinds.index("stop_edges") > kinds.index("establish_outbound"), kinds
        await rig.edges_stopped()

    run_stage(body)


def test_stop_run_while_preparing() -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        rig.ref.tell(EdgeReady(rig.inbound, IN_RING))
        await rig.stop_run()
        assert rig.state() is scm.State.Stopping
        rig.ref.tell(scm.WeightsReady())  # late: ignored while stopping
        rig.ref.tell(wire.RoleConfigured(rig.provision.runtime.role_id))
        rig.ref.tell(scm.EdgeStopped(rig.inbound, True))
        await rig.settle()
        assert rig.state() is scm.State.Stopping, "waits for the outbound edge"
        outcome = await rig.edges_stopped(outbound_clean=False)
        assert stopped(rig) == [(1, False)], "an unclean edge makes an unclean stop"
        assert rig.ports.reported(orun.StageReady) == []
        assert not outcome.clean
        assert "stage_ready" not in rig.ports.event_names()

    run_stage(body)


def test_stopping_times_out_unclean() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        await rig.stop_run()
        rig.ref.tell(scm.EdgeStopped(rig.inbound, True))  # the outbound edge never answers
        outcome = await asyncio.wait_for(asyncio.shield(rig.finished), 5)
        assert stopped(rig) == [(1, False)]
        assert outcome.clean is False

    run_stage(body, grace_s=0.05)


def test_stop_run_for_another_run_is_not_acted_on() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        rig.ref.tell(scm.StopRun(RunId(int(RUN) + 1)))
        await rig.settle()
        assert rig.state() is scm.State.Ready
        assert rig.ports.of("stop_edges") == []

    run_stage(body)


def test_stop_run_before_provisioning_stops_at_once() -> None:
    async def body(rig: StageRig) -> None:
        rig.ref.tell(scm.StopRun(RUN))
        outcome = await asyncio.wait_for(asyncio.shield(rig.finished), 5)
        assert outcome.stopped and outcome.clean and not outcome.provisioned
        assert rig.ports.calls == []

    run_stage(body)


def test_failing_teardown_ports_make_an_unclean_stop() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        rig.ports.fail["reset_role"] = RunFaultError(RunFaultReason.WorkerCrashed, "gone")
        rig.ports.fail["stop_edges"] = RunFaultError(RunFaultReason.PumpFailed, "driver gone")
        rig.ref.tell(scm.StopRun(RUN))
        outcome = await asyncio.wait_for(asyncio.shield(rig.finished), 5)
        assert stopped(rig) == [(1, False)]
        assert outcome.clean is False

    run_stage(body)


def test_protocol_violations_are_listed_not_fatal() -> None:
    async def body(rig: StageRig) -> None:
        await rig.make_ready()
        rig.ref.tell(scm.EdgeStopped(rig.inbound, True))  # no row in Ready
        await rig.settle()
        assert rig.controller.outcome.rejected_events == ["Ready: EdgeStopped"]
        await rig.step(0, len(PROMPT))
        assert rig.state() is scm.State.Ready

    run_stage(body)


@pytest.mark.parametrize("withheld", ["role", "weights", "inbound", "outbound"])
def test_stage_ready_only_when_role_weights_and_both_edges_are(withheld: str) -> None:
    async def body(rig: StageRig) -> None:
        await rig.provision_stage()
        news: dict[str, object] = {
            "role": wire.RoleConfigured(rig.provision.runtime.role_id),
            "weights": scm.WeightsReady(),
            "inbound": EdgeReady(rig.inbound, IN_RING),
            "outbound": EdgeReady(rig.outbound, OUT_RING),
        }
        for name, message in news.items():
            if name != withheld:
                rig.ref.tell(message)  # type: ignore[arg-type]
        await rig.settle()
        assert rig.state() is scm.State.Preparing
        assert rig.ports.reported(orun.StageReady) == []
        rig.ref.tell(news[withheld])  # type: ignore[arg-type]
        await rig.ports.until(lambda: bool(rig.ports.reported(orun.StageReady)))
        assert rig.state() is scm.State.Ready

    run_stage(body)
