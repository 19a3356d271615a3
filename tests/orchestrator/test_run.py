"""The run binding drives the orchestrator_run machine through fake ports (spec §13, §36, §38).

Each test starts a real actor runtime, plans a real 3-stage plan, and plays the stages'
and endpoints' reports into the run actor; the fake ports record what the binding did.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import cast

import pytest

from swactor.actors import Runtime
from swactor.fsm.generated import orchestrator_run as orun
from swactor.orchestrator.inventory import synthetic_pool
from swactor.orchestrator.planner import PlanRequest, plan_run
from swactor.orchestrator.ports import RunResult, StopCause
from swactor.orchestrator.run import InFlight, RunHandle, RunTimeouts, TokenOutput, start_run
from swactor.wire import (
    Component,
    EdgeId,
    NodeId,
    ObjectId,
    PromptSource,
    RunFaultError,
    RunFaultReason,
    RunId,
    RunOutcome,
    RunPlan,
    Sequence,
    StageIndex,
    TeardownOutcome,
)
from swactor.wire.tags import SequenceTag, batch_flags, prompt_flags
from tests.orchestrator.conftest import synthetic_model
from tests.orchestrator.fake_ports import FakePorts
from tests.trace_check import assert_tables_allow

PROMPT = (1, 31, 32, 33)
EOS = 2
TOKEN_IN, TOKEN_OUT = EdgeId(100), EdgeId(103)
STAGE_NODES = (1, 2, 3)
SLOW = RunTimeouts(readiness_s=30, step_s=30, teardown_s=30)


def make_plan(max_tokens: int = 16, max_seq_len: int = 64) -> RunPlan:
    request = PlanRequest(
        run_id=RunId(5), prompt=PromptSource.from_token_ids(PROMPT), max_tokens=max_tokens,
        max_seq_len=max_seq_len, first_edge_id=int(TOKEN_IN),
    )
    return plan_run(synthetic_pool(3), synthetic_model(blocks=6), request).plan


Body = Callable[[Runtime, FakePorts], Awaitable[None]]


def run_test(body: Body) -> None:
    """Run `body`; then every event the run binding emitted must be an order the
    orchestrator_run table allows (`swactor check`), whatever the scenario."""
    ports = FakePorts()

    async def main() -> None:
        async with Runtime("orchestrator") as runtime:
            await body(runtime, ports)

    asyncio.run(asyncio.wait_for(main(), timeout=20))
    if ports.sink.events:
        assert_tables_allow(ports.sink.events, complete=False)


async def start(
    runtime: Runtime, ports: FakePorts, plan: RunPlan | None = None,
    timeouts: RunTimeouts = SLOW,
) -> RunHandle:
    handle = start_run(
        runtime, plan or make_plan(), ports, stop_token_ids=frozenset({EOS, 0}),
        timeouts=timeouts,
    )
    await ports.until(lambda: len(ports.of("provision")) == 3 and len(ports.of("endpoints")) == 1)
    return handle


def make_ready(handle: RunHandle) -> None:
    for i in range(3):
        handle.tell(orun.StageReady(StageIndex(i)))
    handle.tell(orun.EndpointReady(TOKEN_IN))
    handle.tell(orun.EndpointReady(TOKEN_OUT))


def output(sequence: int, token: int) -> TokenOutput:
    return TokenOutput(TOKEN_OUT, ObjectId(1000 + sequence), Sequence(sequence), (token,))


async def stop_all(handle: RunHandle, ports: FakePorts, clean: bool = True) -> RunResult:
    await ports.until(lambda: len(ports.of("stop_run")) == 3 and bool(ports.of("stop_endpoints")))
    for i in range(3):
        handle.tell(orun.StageStopped(StageIndex(i), clean))
    handle.tell(orun.EndpointsStopped(True))
    return await handle.result(5)


def assert_legal_order(names: list[str], *, tokens: int, ending: str | None) -> None:
    """The orchestrator's §40 events of one run, in the only order the spec allows."""
    pattern = (
        "run_planned (stage_provision_started ){3}"
        + ("readiness_barrier_passed prompt_injected " if tokens >= 0 else "")
        + f"(token_received ){{{max(tokens, 0)}}}"
        + (f"{ending} " if ending else "")
        + "(stop_run_sent ){3}run_torn_down"
    )
    joined = " ".join(names)
    assert re.fullmatch(pattern, joined), f"{joined!r} does not match {pattern!r}"


def test_happy_path_until_eos() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        assert sorted(ports.of("provision")) == [
            ("provision", node, i) for i, node in enumerate(STAGE_NODES)
        ]
        assert ports.of("endpoints") == [("endpoints", 100, 103)]
        for i in range(3):
            handle.tell(orun.StageReady(StageIndex(i)))
        handle.tell(orun.EndpointReady(TOKEN_IN))
        await asyncio.sleep(0.01)
        assert ports.of("inject") == [], "no prompt before the readiness barrier"
        handle.tell(orun.EndpointReady(TOKEN_OUT))
        await ports.until(lambda: bool(ports.of("inject")))
        assert ports.of("inject") == [("inject", 100, 0, PROMPT)]
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        assert ports.of("inject")[1] == ("inject", 100, 1, (40,))
        handle.tell(output(1, 41))
        await ports.until(lambda: len(ports.of("inject")) == 3)
        assert ports.of("inject")[2] == ("inject", 100, 2, (41,))
        handle.tell(output(2, EOS))
        result = await stop_all(handle, ports)
        assert len(ports.of("inject")) == 3, "nothing injected after the stop token"
        assert ports.of("release") == [("release", 103, 1000), ("release", 103, 1001),
                                       ("release", 103, 1002)]
        assert sorted(ports.of("stop_run")) == [
            ("stop_run", node, i) for i, node in enumerate(STAGE_NODES)
        ]
        assert (result.outcome, result.teardown) == (RunOutcome.Completed, TeardownOutcome.Clean)
        assert result.generated_token_ids == [40, 41, EOS]
        assert result.stop_cause is StopCause.Eos
        assert result.fault is None and result.late_faults == []
        assert result.prompt_token_ids == PROMPT
        assert result.timings.time_to_first_token_s is not None
        assert_legal_order(ports.event_names(), tokens=3, ending="run_completed")
        received = ports.events("token_received")
        assert [(int(e.sequence or 0), e.token) for e in received] == [  # type: ignore[attr-defined]
            (0, 40), (1, 41), (2, EOS)
        ]
        torn_down = ports.events("run_torn_down")[0]
        assert (torn_down.outcome, torn_down.teardown) == (  # type: ignore[attr-defined]
            RunOutcome.Completed, TeardownOutcome.Clean
        )

    run_test(body)


def test_max_tokens_stops_without_eos() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, make_plan(max_tokens=2))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(output(1, 41))
        result = await stop_all(handle, ports)
        assert result.generated_token_ids == [40, 41]
        assert result.stop_cause is StopCause.MaxTokens
        assert len(ports.of("inject")) == 2
        assert result.outcome is RunOutcome.Completed

    run_test(body)


def test_context_full_stops() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        # 4 prompt ids fill positions 0..3; tokens 1 and 2 are fed back at positions 4 and
        # 5, the last of max_seq_len 6; token 3 has no position left (max_tokens is 5)
        handle = await start(runtime, ports, make_plan(max_tokens=5, max_seq_len=6))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        for step, token in enumerate((40, 41)):
            handle.tell(output(step, token))
            want = step + 2
            await ports.until(lambda: len(ports.of("inject")) == want)  # noqa: B023
        assert [call[2] for call in ports.of("inject")] == [0, 1, 2]
        handle.tell(output(2, 42))
        result = await stop_all(handle, ports)
        assert (result.stop_cause, result.generated_token_ids) == (
            StopCause.ContextFull, [40, 41, 42]
        )
        assert len(ports.of("inject")) == 3

    run_test(body)


def test_stage_fault_while_waiting_ready() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        handle.tell(orun.StageReady(StageIndex(0)))
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.WeightLoadFailed,
                                    Component.ModelLoader))
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.Faulted
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component) == (
            RunFaultReason.WeightLoadFailed, Component.ModelLoader
        )
        assert (result.fault.stage_index, result.fault.node_id) == (1, NodeId(2))
        assert result.teardown is TeardownOutcome.Clean
        assert ports.of("inject") == []
        assert_legal_order(ports.event_names(), tokens=-1, ending="run_faulted")
        faulted = ports.events("run_faulted")[0]
        assert faulted.reason is RunFaultReason.WeightLoadFailed  # type: ignore[attr-defined]
        assert faulted.component is Component.ModelLoader  # type: ignore[attr-defined]

    run_test(body)


def test_stop_run_follows_the_answer_to_a_slow_provisioning() -> None:
    """Stage 1 is refused at once while stage 0's ProvisionStage is still unanswered:
    stage 0's StopRun is sent only after that answer, so it can never reach the node
    before the ProvisionStage (README known issue: 2 leases left by 'provisioning
    rejected')."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        ports.fail[("provision", 1)] = RunFaultError(RunFaultReason.ProvisioningRejected, "no")
        ports.provision_delay_s[0] = 0.3
        handle = start_run(runtime, make_plan(), ports, timeouts=SLOW)
        await ports.until(lambda: len(ports.of("stop_run")) == 2
                          and bool(ports.of("stop_endpoints")))
        for i in (0, 2):
            handle.tell(orun.StageStopped(StageIndex(i), True))
        handle.tell(orun.EndpointsStopped(True))
        result = await handle.result(5)
        assert result.fault is not None and result.fault.stage_index == 1
        calls = ports.calls
        assert calls.index(("stop_run", STAGE_NODES[0], 0)) > calls.index(
            ("provision", STAGE_NODES[0], 0)), calls
        # stage 1's node refused the run: it holds nothing, so no StopRun goes there and
        # the stage counts as stopped clean (before: StopRun, RunMismatch, teardown Faulted)
        assert ("stop_run", STAGE_NODES[1], 1) not in calls, calls
        assert result.teardown is TeardownOutcome.Clean, result

    run_test(body)


def test_fault_mid_run_and_late_fault_do_not_rewrite_the_outcome() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(orun.StageFault(StageIndex(2), RunFaultReason.StepFailed, Component.Worker))
        await ports.until(lambda: len(ports.of("stop_run")) == 3)
        handle.tell(orun.StageFault(StageIndex(0), RunFaultReason.StreamFault,
                                    Component.RecvPump))
        handle.tell(orun.EndpointFault(TOKEN_OUT, RunFaultReason.StreamFault,
                                       Component.TokenEndpoint))
        handle.tell(output(1, 41))  # late output during teardown: ignored
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.Faulted
        assert result.fault is not None
        assert (result.fault.reason, result.fault.stage_index) == (RunFaultReason.StepFailed, 2)
        assert [(f.reason, f.component) for f in result.late_faults] == [
            (RunFaultReason.StreamFault, Component.RecvPump),
            (RunFaultReason.StreamFault, Component.TokenEndpoint),
        ]
        assert result.generated_token_ids == [40]
        assert len(ports.of("inject")) == 2, "no injection after the fault"
        assert result.teardown is TeardownOutcome.Clean
        assert len(ports.events("run_faulted")) == 1
        assert_legal_order(ports.event_names(), tokens=1, ending="run_faulted")

    run_test(body)


def test_a_root_cause_that_arrives_just_after_a_peers_stream_fault_is_recorded() -> None:
    """Stage 1 faults and resets its streams; stage 0's StreamFault (the reset it saw)
    reaches the orchestrator first. The root cause, within the settle window, is the
    recorded fault; the StreamFault is a late fault (orchestrator_run.yaml, Settling)."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=5.0))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.StageFault(StageIndex(0), RunFaultReason.StreamFault,
                                    Component.Driver))
        handle.tell(output(0, 40))  # the run faulted already: not accepted
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.ObjectHeaderMalformed,
                                    Component.IngressParser))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.stage_index) == (
            RunFaultReason.ObjectHeaderMalformed, Component.IngressParser, 1)
        assert [(f.reason, f.stage_index) for f in result.late_faults] == [
            (RunFaultReason.StreamFault, 0)]
        assert result.generated_token_ids == []
        assert len(ports.events("run_faulted")) == 1
        assert_legal_order(ports.event_names(), tokens=0, ending="run_faulted")

    run_test(body)


def test_a_stream_fault_with_no_root_cause_is_recorded_after_the_settle_window() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=0.5))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.StreamFault,
                                    Component.Driver))
        await asyncio.sleep(0.1)
        assert ports.of("stop_run") == [], "held for the settle window"
        await ports.until(lambda: len(ports.of("stop_run")) == 3)
        handle.tell(orun.StageFault(StageIndex(2), RunFaultReason.StepFailed,
                                    Component.Worker))  # after the window: late
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.stage_index) == (
            RunFaultReason.StreamFault, 1)
        assert [f.reason for f in result.late_faults] == [RunFaultReason.StepFailed]

    run_test(body)


def test_stream_faults_in_the_window_are_late_and_a_later_root_cause_still_wins() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=5.0))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.EndpointFault(TOKEN_OUT, RunFaultReason.StreamFault,
                                       Component.TokenEndpoint))
        handle.tell(orun.StageFault(StageIndex(0), RunFaultReason.StreamFault,
                                    Component.SendPump))
        handle.tell(orun.StageFault(StageIndex(2), RunFaultReason.WorkerCrashed,
                                    Component.WorkerCtl))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.stage_index) == (
            RunFaultReason.WorkerCrashed, Component.WorkerCtl, 2)
        assert [(f.reason, f.component, f.stage_index, f.edge_id)
                for f in result.late_faults] == [
            (RunFaultReason.StreamFault, Component.TokenEndpoint, None, TOKEN_OUT),
            (RunFaultReason.StreamFault, Component.SendPump, 0, None),
        ], "the held fault first: late faults keep their arrival order"
        assert len(ports.events("run_faulted")) == 1

    run_test(body)


def test_membership_loss_in_the_window_is_the_root_cause() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=5.0))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.StreamFault,
                                    Component.RecvPump))
        handle.tell(orun.MembershipLost(NodeId(3)))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.node_id) == (
            RunFaultReason.MembershipLost, Component.Membership, NodeId(3))
        assert [(f.reason, f.stage_index) for f in result.late_faults] == [
            (RunFaultReason.StreamFault, 1)]

    run_test(body)


def test_operator_stop_in_the_window_ends_it_with_the_held_fault() -> None:
    """The fault came first, so the run is Faulted; the stop does not wait out the window."""
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=60.0))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.StageFault(StageIndex(1), RunFaultReason.StreamFault,
                                    Component.Driver))
        handle.stop()
        result = await stop_all(handle, ports)  # within run_test's 20 s, not the 60 s window
        assert result.outcome is RunOutcome.Faulted
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.stage_index) == (
            RunFaultReason.StreamFault, Component.Driver, 1)
        assert result.late_faults == []
        assert_legal_order(ports.event_names(), tokens=0, ending="run_faulted")

    run_test(body)


def test_a_stream_fault_before_readiness_holds_the_prompt_back() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, timeouts=replace(SLOW, fault_settle_s=0.3))
        handle.tell(orun.StageFault(StageIndex(0), RunFaultReason.StreamFault,
                                    Component.Driver))
        make_ready(handle)  # readiness in the window: ignored, no prompt
        result = await stop_all(handle, ports)
        assert ports.of("inject") == []
        assert result.fault is not None
        assert (result.fault.reason, result.fault.stage_index) == (
            RunFaultReason.StreamFault, 0)
        assert result.rejected_events == []
        assert_legal_order(ports.event_names(), tokens=-1, ending="run_faulted")

    run_test(body)


def test_operator_stop_mid_run() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.stop()
        result = await stop_all(handle, ports)
        assert (result.outcome, result.teardown) == (
            RunOutcome.OperatorStopped, TeardownOutcome.Clean
        )
        assert result.fault is None
        assert_legal_order(ports.event_names(), tokens=1, ending=None)
        torn_down = ports.events("run_torn_down")[0]
        assert torn_down.outcome is RunOutcome.OperatorStopped  # type: ignore[attr-defined]

    run_test(body)


def test_teardown_timeout() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        timeouts = RunTimeouts(readiness_s=30, step_s=30, teardown_s=0.05)
        handle = await start(runtime, ports, timeouts=timeouts)
        handle.stop()
        await ports.until(lambda: len(ports.of("stop_run")) == 3)
        handle.tell(orun.StageStopped(StageIndex(0), True))
        handle.tell(orun.StageStopped(StageIndex(2), True))
        handle.tell(orun.EndpointsStopped(True))
        result = await handle.result(5)
        assert result.teardown is TeardownOutcome.TimedOut
        assert result.unstopped_stages == (StageIndex(1),)
        assert result.outcome is RunOutcome.OperatorStopped

    run_test(body)


def test_unclean_stage_stop_faults_the_teardown_only() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, make_plan(max_tokens=1))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("stop_run")) == 3)
        handle.tell(orun.StageStopped(StageIndex(0), True))
        handle.tell(orun.StageStopped(StageIndex(1), False))
        handle.tell(orun.StageStopped(StageIndex(2), True))
        handle.tell(orun.EndpointsStopped(True))
        result = await handle.result(5)
        assert (result.outcome, result.teardown) == (RunOutcome.Completed, TeardownOutcome.Faulted)
        assert result.unclean_stages == (StageIndex(1),)

    run_test(body)


def test_out_of_order_output_is_a_sequence_violation() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(output(1, 40))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component) == (
            RunFaultReason.SequenceViolation, Component.Orchestrator
        )
        assert result.generated_token_ids == []

    run_test(body)


def test_readiness_timeout() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        timeouts = RunTimeouts(readiness_s=0.05, step_s=30, teardown_s=30)
        handle = await start(runtime, ports, timeouts=timeouts)
        handle.tell(orun.StageReady(StageIndex(0)))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ReadinessTimeout
        assert ports.of("inject") == []

    run_test(body)


def test_step_timeout() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        timeouts = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=0.05)
        handle = await start(runtime, ports, timeouts=timeouts)
        make_ready(handle)
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.Faulted
        assert result.fault is not None and result.fault.component is Component.Orchestrator
        # a stalled step is a progress timeout, never a readiness one
        assert result.fault.reason is RunFaultReason.ProgressTimeout
        assert_legal_order(ports.event_names(), tokens=0, ending="run_faulted")

    run_test(body)


def test_the_prompt_may_outlast_the_step_timeout_and_the_next_step_may_not() -> None:
    # step 0 builds the prefill kernels of a new prompt length: it gets prefill_s; step 1
    # (kernels built) gets step_s
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        timeouts = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=30)
        handle = await start(runtime, ports, timeouts=timeouts)
        make_ready(handle)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        await asyncio.sleep(0.3)  # six step timeouts long
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        result = await stop_all(handle, ports)  # step 1 is never answered
        assert result.generated_token_ids == [40]
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ProgressTimeout
        assert_legal_order(ports.event_names(), tokens=1, ending="run_faulted")

    run_test(body)


def test_a_prompt_that_outlasts_the_prefill_timeout_faults_the_run(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        timeouts = RunTimeouts(readiness_s=30, step_s=0.05, teardown_s=30, prefill_s=0.175)
        handle = await start(runtime, ports, timeouts=timeouts)
        make_ready(handle)
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.reason is RunFaultReason.ProgressTimeout

    with caplog.at_level(logging.WARNING, logger="swactor.orchestrator.run"):
        run_test(body)
    waits = [r.getMessage() for r in caplog.records if "has not come back" in r.getMessage()]
    # four step timeouts: three waits (after 0.05, 0.10 and 0.15 s < 0.175), then the fault
    assert len(waits) == 3 and all("the prompt of step 0" in w for w in waits)


def test_in_flight_objects_say_whether_a_prompt_is_awaited() -> None:
    prompt = InFlight(0, None, 0)
    assert prompt.prompt and not InFlight(3, None, 0).prompt  # a single-prompt run's steps
    assert InFlight(5, 1, SequenceTag(2, 0).pack()).prompt
    assert not InFlight(6, 1, SequenceTag(2, 9).pack()).prompt
    assert InFlight(7, None, prompt_flags(2), table=(1, 2)).prompt
    assert not InFlight(8, None, batch_flags(2), rows=(1, 2), table=(3, 4)).prompt


def test_unreachable_node_faults_provisioning_and_teardown() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        ports.fail[("provision", 1)] = RunFaultError(RunFaultReason.NodeUnavailable, "no route")
        ports.fail[("stop_run", 1)] = RunFaultError(RunFaultReason.NodeUnavailable, "no route")
        handle = await start(runtime, ports)
        await ports.until(lambda: len(ports.of("stop_run")) == 3)
        handle.tell(orun.StageStopped(StageIndex(0), True))
        handle.tell(orun.StageStopped(StageIndex(2), True))
        handle.tell(orun.EndpointsStopped(True))
        result = await handle.result(5)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.stage_index) == (
            RunFaultReason.NodeUnavailable, 1
        )
        assert (result.outcome, result.teardown) == (RunOutcome.Faulted, TeardownOutcome.Faulted)
        assert result.unclean_stages == (StageIndex(1),)

    run_test(body)


def test_failed_injection_is_an_endpoint_fault() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        ports.fail[("inject", 0)] = RunFaultError(RunFaultReason.RingFault, "ring closed")
        handle = await start(runtime, ports)
        make_ready(handle)
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.edge_id) == (
            RunFaultReason.RingFault, Component.TokenEndpoint, TOKEN_IN
        )
        assert ports.events("prompt_injected") == []

    run_test(body)


def test_membership_loss() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.MembershipLost(NodeId(3)))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component, result.fault.node_id) == (
            RunFaultReason.MembershipLost, Component.Membership, NodeId(3)
        )

    run_test(body)


def test_teardown_does_not_wait_for_a_lost_nodes_stop() -> None:
    # Stage 2's node is declared lost: a killed node never answers its StopRun, so its
    # stage counts as stopped (not clean) once the StopRun is sent; the survivors'
    # stops alone end the teardown, long before its timer (SLOW: 30 s).
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.MembershipLost(NodeId(3)))
        await ports.until(lambda: len(ports.of("stop_run")) == 3
                          and bool(ports.of("stop_endpoints")))
        assert ("stop_run", 3, 2) in ports.of("stop_run"), "the lost node is still told"
        for i in range(2):
            handle.tell(orun.StageStopped(StageIndex(i), True))
        handle.tell(orun.EndpointsStopped(True))
        result = await handle.result(5)
        assert result.teardown is TeardownOutcome.Faulted
        assert (result.unclean_stages, result.unstopped_stages) == ((StageIndex(2),), ())

    run_test(body)


def test_peer_events_the_machine_refuses_are_recorded_not_fatal() -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports, make_plan(max_tokens=2))
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(orun.StageReady(StageIndex(1)))  # duplicate, after the barrier
        handle.tell(output(0, 40))
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle.tell(output(1, 41))
        result = await stop_all(handle, ports)
        assert result.outcome is RunOutcome.Completed
        assert result.rejected_events == ["Running: StageReady"]

    run_test(body)


def test_operator_stop_before_the_plan_is_done_at_once() -> None:
    machine = orun.OrchestratorRunMachine(
        cast(orun.OrchestratorRunGuards, _NeverAsked()), readiness_timeout_s=1,
        step_timeout_s=1, teardown_timeout_s=1, fault_settle_s=1, prefill_timeout_s=1,
    )
    effects = machine.handle(orun.OperatorStop())
    assert machine.state is orun.State.Done
    assert orun.RecordRunOutcome(RunOutcome.OperatorStopped) in effects


class _NeverAsked:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"guard {name} asked")


@pytest.mark.parametrize("bad", [(), (40, 41)])
def test_token_object_without_exactly_one_id_faults(bad: tuple[int, ...]) -> None:
    async def body(runtime: Runtime, ports: FakePorts) -> None:
        handle = await start(runtime, ports)
        make_ready(handle)
        await ports.until(lambda: bool(ports.of("inject")))
        handle.tell(TokenOutput(TOKEN_OUT, ObjectId(9), Sequence(0), bad))
        result = await stop_all(handle, ports)
        assert result.fault is not None
        assert result.fault.component is Component.TokenEndpoint
        assert result.generated_token_ids == []

    run_test(body)
