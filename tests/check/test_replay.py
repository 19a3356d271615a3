"""`swactor check`: lifecycle logs the tables allow pass, planted illegal ones fail."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from swactor.check.lifecycle import ANCHORS, KEYS, UNCHECKED, Anchor
from swactor.check.replay import MappingError, Program, check, program
from swactor.cli import main
from swactor.events.names import EventName
from swactor.events.schema import (
    EdgeProvisionStarted,
    EdgeReady,
    Emitted,
    ExecuteStepStarted,
    LifecycleEvent,
    ObjectLoaded,
    ObjectProduced,
    PromptInjected,
    ReadinessBarrierPassed,
    RunCompleted,
    RunFaulted,
    RunPlanned,
    RunTornDown,
    StageProvisionStarted,
    StageReady,
    StageStopped,
    StepCompleted,
    StopRunSent,
    TokenReceived,
    WeightsDownloaded,
    WeightsDownloadStarted,
    WeightsLoaded,
)
from swactor.fsm.generated import orchestrator_run
from swactor.wire import (
    Component,
    EdgeId,
    NodeId,
    ObjectId,
    RingId,
    RunFaultReason,
    RunId,
    RunOutcome,
    Sequence,
    StageIndex,
    StepId,
    TeardownOutcome,
    WorkerGeneration,
)

ORCH, NODE, RUN = NodeId(1), NodeId(2), RunId(5)
TOKEN_IN, MIDDLE, TOKEN_OUT = EdgeId(10), EdgeId(11), EdgeId(12)
GEN = WorkerGeneration(1)


def emitted(events: list[LifecycleEvent], proc: str, pid: int = 100) -> list[Emitted]:
    return [Emitted(event, 1000 + i, 2000 + i, pid, proc) for i, event in enumerate(events)]


def orchestrator_run_events(tokens: int = 2) -> list[LifecycleEvent]:
    run = {"node_id": ORCH, "run_id": RUN}
    out: list[LifecycleEvent] = [RunPlanned(**run)]
    out += [StageProvisionStarted(**run, stage_index=StageIndex(i)) for i in (0, 1)]
    out += [EdgeProvisionStarted(**run, edge_id=e) for e in (TOKEN_OUT, TOKEN_IN)]
    out += [EdgeReady(**run, edge_id=e, ring_id=RingId(e + 100)) for e in (TOKEN_IN, TOKEN_OUT)]
    out += [ReadinessBarrierPassed(**run),
            PromptInjected(**run, edge_id=TOKEN_IN, object_id=ObjectId(1), sequence=Sequence(0))]
    out += [TokenReceived(**run, edge_id=TOKEN_OUT, object_id=ObjectId(k + 1),
                          sequence=Sequence(k), token=7) for k in range(tokens)]
    out += [RunCompleted(**run)]
    out += [StopRunSent(**run, stage_index=StageIndex(i)) for i in (1, 0)]
    out += [RunTornDown(**run, outcome=RunOutcome.Completed, teardown=TeardownOutcome.Clean)]
    return out


def stage_events(steps: int = 2) -> list[LifecycleEvent]:
    stage = {"node_id": NODE, "run_id": RUN, "stage_index": StageIndex(0)}
    out: list[LifecycleEvent] = [WeightsDownloadStarted(**stage)]
    out += [EdgeProvisionStarted(node_id=NODE, run_id=RUN, edge_id=e) for e in (TOKEN_IN, MIDDLE)]
    out += [WeightsDownloaded(**stage), WeightsLoaded(**stage, worker_generation=GEN)]
    out += [EdgeReady(node_id=NODE, run_id=RUN, edge_id=e, ring_id=RingId(e + 200))
            for e in (MIDDLE, TOKEN_IN)]
    out += [StageReady(**stage, worker_generation=GEN)]
    for k in range(steps):
        step = {"step_id": StepId(k + 1), "sequence": Sequence(k), "worker_generation": GEN}
        out += [
            ObjectLoaded(**stage, edge_id=TOKEN_IN, ring_id=RingId(210),
                         object_id=ObjectId(k + 1), sequence=Sequence(k),
                         worker_generation=GEN),
            ExecuteStepStarted(**stage, **step),
            ObjectProduced(**stage, **step, edge_id=MIDDLE, ring_id=RingId(211),
                           object_id=ObjectId(k + 1)),
            StepCompleted(**stage, **step),
        ]
    out += [StageStopped(**stage)]
    return out


def test_a_clean_run_is_allowed_and_complete() -> None:
    reports = check(emitted(orchestrator_run_events(), "orchestrator")
                    + emitted(stage_events(), "node-2", pid=200))
    assert [r.verdict for r in reports] == ["ok", "ok"], [r.line() for r in reports]
    orchestrator, stage = reports
    assert orchestrator.role == "orchestrator" and stage.role == "stage"
    run = orchestrator.trackers[0]
    assert run.machine == "orchestrator_run"
    # the barrier alone may open a serving run too; prompt_injected then says which
    assert run.seen[:4] == ["Provisioning", "WaitingReady", "Running|ServingIdle", "Running"]
    assert run.seen[-1] == "Done" and run.complete
    assert sorted(t.machine for t in stage.trackers) == [
        "edge_record", "edge_record", "stage_controller"]
    assert stage.line().startswith("ok node-2[200] run 5 (stage")


def _planted(events: list[LifecycleEvent], proc: str, index: int, event: str,
             states: tuple[str, ...]) -> None:
    (report,) = check(emitted(events, proc))
    assert report.verdict == "violation", report.line()
    found = report.violation
    assert found is not None and found[1:] == (index, event), report.line()
    tracker = found[0]
    assert tracker is not None and tracker.violation is not None
    assert tracker.violation.states == states, report.line()
    assert report.line().startswith("VIOLATION")


Plant = Callable[[list[LifecycleEvent]], tuple[list[LifecycleEvent], int, str, tuple[str, ...]]]


def _token_before_barrier(events: list[LifecycleEvent]
                          ) -> tuple[list[LifecycleEvent], int, str, tuple[str, ...]]:
    token = next(i for i, e in enumerate(events) if isinstance(e, TokenReceived))
    moved = events[token]
    rest = events[:token] + events[token + 1:]
    return [*rest[:3], moved, *rest[3:]], 3, "token_received", ("WaitingReady",)


def _completed_twice(events: list[LifecycleEvent]
                     ) -> tuple[list[LifecycleEvent], int, str, tuple[str, ...]]:
    at = next(i for i, e in enumerate(events) if isinstance(e, RunCompleted))
    return [*events[:at + 1], events[at], *events[at + 1:]], at + 1, "run_completed", (
        "TearingDown",)


def _token_after_teardown(events: list[LifecycleEvent]
                          ) -> tuple[list[LifecycleEvent], int, str, tuple[str, ...]]:
    token = next(e for e in events if isinstance(e, TokenReceived))
    return [*events, token], len(events), "token_received", ("Done",)


def _faulted_after_completed(events: list[LifecycleEvent]
                             ) -> tuple[list[LifecycleEvent], int, str, tuple[str, ...]]:
    at = next(i for i, e in enumerate(events) if isinstance(e, RunCompleted))
    fault = RunFaulted(node_id=ORCH, run_id=RUN, reason=RunFaultReason.StepFailed,
                       component=Component.Worker)
    return [*events[:at + 1], fault, *events[at + 1:]], at + 1, "run_faulted", (
        "TearingDown",)


@pytest.mark.parametrize("plant", [_token_before_barrier, _completed_twice,
                                   _token_after_teardown, _faulted_after_completed])
def test_planted_illegal_orchestrator_traces_fail(plant: Plant) -> None:
    events, index, event, states = plant(orchestrator_run_events())
    _planted(events, "orchestrator", index, event, states)


def test_stage_ready_before_the_weights_fails() -> None:
    events = stage_events()
    ready = next(e for e in events if isinstance(e, StageReady))
    _planted([ready, *[e for e in events if e is not ready]], "node-2", 0, "stage_ready",
             ("Unprovisioned",))


def test_a_step_after_the_stage_stopped_fails() -> None:
    events = stage_events()
    step = next(e for e in events if isinstance(e, StepCompleted))
    _planted([*events, step], "node-2", len(events), "step_completed", ("Stopped",))


def test_edge_ready_before_its_provisioning_fails() -> None:
    events = stage_events()
    ready = next(e for e in events if isinstance(e, EdgeReady) and e.edge_id == MIDDLE)
    first = [ready, *[e for e in events if e is not ready]]
    (report,) = check(emitted(first, "node-2"))
    assert report.verdict == "violation"
    found = report.violation
    assert found is not None and found[0] is not None
    assert found[0].machine == "edge_record" and found[0].violation is not None
    assert found[0].violation.states == ("New",)
    assert found[0].violation.expected == ("edge_provision_started",)


def test_a_run_cut_short_is_incomplete() -> None:
    events = orchestrator_run_events()[:-1]  # no run_torn_down
    (report,) = check(emitted(events, "orchestrator"))
    assert report.verdict == "incomplete" and report.line().startswith("INCOMPLETE")


def test_events_of_two_roles_in_one_process_run_fail() -> None:
    events = [*stage_events()[:3], RunPlanned(node_id=NODE, run_id=RUN)]
    (report,) = check(emitted(events, "node-2"))
    assert report.verdict == "violation"
    assert report.violation is not None and report.violation[0] is None
    assert "belongs to no table" in report.line()


def test_each_process_is_replayed_in_its_own_monotonic_order() -> None:
    events = emitted(orchestrator_run_events(), "orchestrator")
    shuffled = list(reversed(events))  # file order does not matter: `mono` orders a process
    assert [r.verdict for r in check(shuffled)] == ["ok"]


def test_every_lifecycle_event_is_anchored_or_listed_as_unchecked() -> None:
    anchored = {a.event for a in ANCHORS}
    assert anchored | set(UNCHECKED) == set(EventName)
    assert not anchored & set(UNCHECKED)
    for machine in KEYS:
        assert program(machine).names  # every anchor of the machine resolves in its table


@pytest.mark.parametrize("anchor", [
    Anchor(EventName.run_completed, "orchestrator_run", on_effect="RecordOutcome"),
    Anchor(EventName.run_completed, "orchestrator_run", on_effect="RecordRunOutcome",
           where=("result", "Completed")),
    Anchor(EventName.run_planned, "orchestrator_run", on_event=("PlanReady",)),
    Anchor(EventName.stop_run_sent, "orchestrator_run", in_states=("Stopping",)),
    Anchor(EventName.stop_run_sent, "orchestrator_run"),
])
def test_an_anchor_naming_nothing_in_its_table_is_refused(anchor: Anchor) -> None:
    with pytest.raises(MappingError):
        Program.build(orchestrator_run.MODEL, [anchor])


def _write(path: Path, events: list[Emitted]) -> Path:
    path.write_text("".join(e.to_line() + "\n" for e in events))
    return path


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "orchestrator.jsonl", emitted(orchestrator_run_events(), "orch"))
    stage = _write(tmp_path / "node.jsonl", emitted(stage_events(), "node-2", pid=200))
    assert main(["check", str(good), str(stage)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("ok: ") and len(out) == 3

    planted, index, _, _ = _completed_twice(orchestrator_run_events())
    bad = _write(tmp_path / "planted.jsonl", emitted(planted, "orch"))
    assert main(["check", "--json", str(bad), str(stage)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "violation"
    (failed,) = [g for g in document["groups"] if g["verdict"] == "violation"]
    assert failed["first_violation"] == {"index": index, "event": "run_completed"}
    assert failed["machines"][0]["violation"]["states"] == ["TearingDown"]

    cut = _write(tmp_path / "cut.jsonl", emitted(orchestrator_run_events()[:-1], "orch"))
    assert main(["check", str(cut)]) == 0
    assert main(["check", "--complete", str(cut)]) == 1
    capsys.readouterr()

    (tmp_path / "junk.jsonl").write_text("{not json\n")
    assert main(["check", str(tmp_path / "junk.jsonl"), str(good)]) == 2
    assert main(["check", str(tmp_path / "missing.jsonl")]) == 2
