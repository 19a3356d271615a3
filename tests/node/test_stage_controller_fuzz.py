"""Hypothesis: any order of peer mail leaves the StageController within its contract (§14).

Sequences of what the orchestrator, the edge actors, the weight loader and GpuWorkerCtl
may send, in any order, with duplicates, strangers and stale answers, are played into a
real controller actor (fake ports). Whatever happens, the ports must have seen:

- one standing GrantSteps, only with StageReady, from input sequence 0; at most one
  RevokeSteps, only after the grant and only once a fault or StopRun came;
- a step recorded only for a StepCompleted of the grant's step ids;
- StageReady at most once, and only after the role, the weights and both edges were
  reported ready;
- at most one StageFault other than provisioning rejections (the first fault only);
- StageStopped at most once, nothing reported after it, and the actor never crashed.

Moves that need a live step id (StepCompleted, StepFailed) name the grant's next step,
so sequences do run several steps deep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from swactor import wire
from swactor.actors import Runtime
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import stage_controller as scm
from swactor.node.stage_controller import StageController, StageControllerConfig
from swactor.node.stage_ports import StageOutcome
from swactor.node.worker_ctl import WorkerCrashed
from swactor.wire import (
    Component,
    EdgeReady,
    NodeId,
    ObjectFailure,
    RunFaultReason,
    StepFailure,
    WorkerGeneration,
)
from tests.node.fake_stage_ports import FakeStagePorts
from tests.node.stage_rig import IN_RING, OUT_RING, handle, make_plan, provision_of

MOVES = st.sampled_from([
    "setup_all", "load", "complete", "load", "complete", "produced",
    "provision", "provision_stranger", "edge_in", "edge_out", "weights", "weights_failed",
    "role", "role_failed", "load", "complete", "complete_stale", "complete_again",
    "step_failed", "edge_stopped_in", "edge_stopped_out",
    "edge_stopped_unclean", "stop", "crash", "edge_fault", "object_failed",
])

GOOD_MOVES = st.sampled_from(["load", "complete", "produced"] * 15 + [
    "complete_again", "complete_stale", "step_failed", "stop",
    "edge_stopped_in", "edge_stopped_out", "crash", "edge_fault",
])
"""Mostly the moves of a healthy run, so that examples get several steps deep."""


def message_for(move: str, ports: FakeStagePorts, provision: wire.ProvisionStage,
                orchestrator: NodeId) -> Any:
    role, inbound, outbound = (provision.runtime.role_id, provision.inbound.edge_id,
                               provision.outbound.edge_id)
    grants = [c[1] for c in ports.of("grant_steps") if isinstance(c[1], wire.GrantSteps)]
    first = grants[0].first_step_id if grants else wire.StepId(1)
    done = ports.event_names().count("step_completed")
    alignment = provision.inbound.object_spec.alignment

    def completed(k: int) -> wire.StepCompleted:
        now = time.monotonic_ns()
        return wire.StepCompleted(role, wire.StepId(first + k), wire.StepRecord(
            wire.Sequence(k), wire.ObjectId(k + 1), alignment, wire.ObjectId(k + 1), 4,
            now, now, now, now))

    match move:
        case "setup_all":
            return [scm.ProvisionStage(orchestrator, provision),
                    EdgeReady(inbound, IN_RING), EdgeReady(outbound, OUT_RING),
                    scm.WeightsReady(), wire.RoleConfigured(role)]
        case "provision":
            return scm.ProvisionStage(orchestrator, provision)
        case "provision_stranger":
            return scm.ProvisionStage(NodeId(4242), provision)
        case "edge_in":
            return EdgeReady(inbound, IN_RING)
        case "edge_out":
            return EdgeReady(outbound, OUT_RING)
        case "weights":
            return scm.WeightsReady()
        case "weights_failed":
            return scm.WeightsFailed(RunFaultReason.WeightDownloadFailed)
        case "role":
            return wire.RoleConfigured(role)
        case "role_failed":
            return wire.RoleFailed(role, wire.RoleFailure.TinygradError)
        case "load":
            return wire.ObjectLoaded(IN_RING, inbound, provision.runtime.input_port,
                                     wire.ObjectId(done + 1), wire.Sequence(done), alignment,
                                     handle(done))
        case "produced":
            return wire.ObjectProduced(OUT_RING, outbound, provision.runtime.output_port,
                                       wire.ObjectId(done + 1), wire.Sequence(done), 4)
        case "complete":
            return completed(done)
        case "complete_again":
            return completed(max(done - 1, 0))
        case "complete_stale":
            return dataclasses.replace(completed(done), step_id=wire.StepId(first + (1 << 33)))
        case "step_failed":
            return wire.StepFailed(role, wire.StepId(first + done), StepFailure.TinygradError)
        case "edge_stopped_in":
            return scm.EdgeStopped(inbound, True)
        case "edge_stopped_out":
            return scm.EdgeStopped(outbound, True)
        case "edge_stopped_unclean":
            return scm.EdgeStopped(outbound, False)
        case "stop":
            return scm.StopRun(provision.run_id)
        case "crash":
            return WorkerCrashed(WorkerGeneration(1), -9)
        case "edge_fault":
            return scm.EdgeFault(outbound, RunFaultReason.StreamFault, Component.TxEdge)
        case "object_failed":
            return wire.ObjectFailed(IN_RING, inbound, provision.runtime.input_port, None, None,
                                     ObjectFailure.HeaderMalformed)
    raise AssertionError(move)


def check_contract(ports: FakeStagePorts, trace: list[str]) -> None:
    reports = [m for _, _, m in ports.reports]
    readies = [m for m in reports if isinstance(m, orun.StageReady)]
    assert len(readies) <= 1, trace
    stops = [i for i, m in enumerate(reports) if isinstance(m, orun.StageStopped)]
    assert len(stops) <= 1 and (not stops or stops[0] == len(reports) - 1), trace
    faults = [m for m in reports if isinstance(m, orun.StageFault)
              and m.reason is not RunFaultReason.ProvisioningRejected]
    assert len(faults) <= 1, trace
    grants = [c[1] for c in ports.of("grant_steps") if isinstance(c[1], wire.GrantSteps)]
    assert len(grants) <= 1, trace
    if grants:
        assert readies, f"GrantSteps before StageReady: {trace}"
        assert grants[0].input.sequence == 0, trace
    revokes = ports.of("revoke_steps")
    assert len(revokes) <= len(grants), trace
    if revokes:
        kinds = ports.kinds()
        assert kinds.index("revoke_steps") > kinds.index("grant_steps"), trace
        assert faults or "stop" in trace, trace
    steps = ports.event_names().count("step_completed")
    if steps:
        assert grants, f"a step recorded with no grant: {trace}"
    event(f"steps recorded: {min(steps, 3)}{'+' if steps > 3 else ''}")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(["setup_all", "load", "complete", "produced", "load", "complete", "load", "stop",
          "complete", "edge_stopped_in", "edge_stopped_out"])
@given(st.one_of(
    st.lists(MOVES, min_size=1, max_size=30),
    st.lists(GOOD_MOVES, min_size=10, max_size=40).map(lambda moves: ["setup_all", *moves]),
))
def test_any_mail_order_keeps_the_contract(moves: list[str]) -> None:
    plan = make_plan()
    provision = provision_of(plan, 1)
    orchestrator = plan.orchestrator_node

    async def main() -> None:
        async with Runtime("node") as runtime:
            ports = FakeStagePorts()
            finished: asyncio.Future[StageOutcome] = asyncio.get_running_loop().create_future()
            config = StageControllerConfig(plan.stages[1].node_id, orchestrator,
                                           stopping_grace_s=30.0)
            controller = StageController(config, ports, finished)
            ref = runtime.spawn(lambda: controller, "stage")
            trace: list[str] = []
            for move in moves:
                if finished.done():
                    break
                trace.append(move)
                mail = message_for(move, ports, provision, orchestrator)
                for message in mail if isinstance(mail, list) else [mail]:
                    ref.tell(message)
                for _ in range(10):
                    await asyncio.sleep(0)
                recorded = ports.event_names().count("step_completed")
                assert controller.outcome.steps_completed == recorded, trace
            check_contract(ports, trace)
            if finished.done():
                assert finished.exception() is None, trace
                assert ref.alive is False or controller.machine.state is scm.State.Stopped
            else:
                assert ref.alive, f"the controller crashed: {trace}"

    asyncio.run(asyncio.wait_for(main(), timeout=20))
