"""The serving recovery rows' arithmetic: figures from event records and streams.

Records and chunk arrival times are written here with chosen timestamps, so each
expected figure is known from the inputs, not from the code under test.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.recovery import PHASES, Failed, Trial, as_json, serve_figures
from bench.report import recovery_goals

S = 1_000_000_000
FAULT_NS = 100 * S
"""The fault's wall time (ns); the fault's monotonic time is 100.0 too."""


def _orchestrator(old: int = 1, new: int = 2, faults: int = 1) -> list[dict[str, Any]]:
    """A recovery from run `old` to run `new`: detection 0.5 s after the fault, torn down
    0.2 s later, planned 0.1, barrier 3.0, migrated sequences started 0.1 and first token
    0.4 after that (every time below is seconds after the fault)."""

    def at(seconds: float, event: str, **fields: Any) -> dict[str, Any]:
        return {"event": event, "wall": FAULT_NS + int(seconds * S), **fields}

    records = [
        at(-5.0, "run_faulted", run_id=0, reason="Earlier", component="old"),  # before it
        at(0.5, "run_faulted", run_id=old, reason="WorkerCrashed", component="worker_ctl"),
        at(0.6, "serve_recovery_started", run_id=None),
        at(0.6, "sequence_migrated", run_id=new, detail={"sequence_id": 1}),
        at(0.6, "sequence_migrated", run_id=new, detail={"sequence_id": 2}),
        at(0.7, "run_torn_down", run_id=old),
        at(0.8, "run_planned", run_id=new),
        at(3.8, "readiness_barrier_passed", run_id=new),
        at(3.8, "serve_recovery_completed", run_id=new),
        at(3.85, "sequence_started", run_id=new),
        at(3.9, "sequence_started", run_id=new),
        at(4.3, "sequence_first_token", run_id=new),
    ]
    for extra in range(faults - 1):  # a later fault hits the new run too
        records.append(at(6.0 + extra, "run_faulted", run_id=new, reason="WorkerCrashed",
                          component="worker_ctl"))
    return records


def _nodes(holder_in_new_run: bool) -> list[dict[str, Any]]:
    """Nodes 10, 11, 12 held stages 0..2 of run 1; run 2 is on 10, 12 and 13 (the
    spare), or on 10, 11, 12 again; each stage_ready of run 2 at 3.0 s, one reused."""
    old = [{"event": "stage_ready", "run_id": 1, "node_id": 10 + stage, "stage_index": stage,
            "wall": FAULT_NS - 9 * S} for stage in range(3)]
    on = (10, 11, 12) if holder_in_new_run else (10, 12, 13)
    new = [{"event": "stage_ready", "run_id": 2, "node_id": node, "stage_index": stage,
            "role_reused": stage == 0, "wall": FAULT_NS + 3 * S}
           for stage, node in enumerate(on)]
    return old + new


REFERENCE = [["a", "b", "c", "d"], ["e", "f", "g", "h"]]


def test_serve_figures_time_each_phase_and_count_nothing_lost() -> None:
    # stream 0's chunks at 99.0, 99.5 | fault at 100.0 | 104.5, 104.6; stream 1 at 105.0
    faulted = [(REFERENCE[0], [99.0, 99.5, 104.5, 104.6]),
               (REFERENCE[1], [99.1, 99.6, 105.0, 105.1])]
    trial = serve_figures("serve_worker_budget", REFERENCE, faulted, 100.0, FAULT_NS,
                          _orchestrator(faults=3), _nodes(holder_in_new_run=True))
    assert (trial.reason, trial.component) == ("WorkerCrashed", "worker_ctl")
    assert trial.detect_s == pytest.approx(0.5)
    extra = trial.extra
    assert extra["teardown_s"] == pytest.approx(0.2)
    assert extra["ready_s"] == pytest.approx(3.8)
    assert extra["next_token_s"] == pytest.approx(5.0)  # stream 1: fault -> 105.0
    assert extra["detect_to_next_s"] == pytest.approx(4.5)
    assert (extra["lost"], extra["duplicated"], extra["migrated"]) == (0.0, 0.0, 2.0)
    assert extra["faults"] == 3.0 and extra["stages_reused"] == 1.0
    assert extra["faulted_node_in_new_run"] == 1.0
    phases = {name: extra[f"phase_{name}_s"] for name, _ in PHASES}
    assert phases == pytest.approx({"detect": 0.5, "teardown": 0.2, "replan": 0.1,
                                    "provision": 2.2, "barrier": 0.8, "resubmit": 0.1,
                                    "prefill": 0.4})
    assert extra["phase_deliver_s"] == pytest.approx(5.0 - 4.3)


def test_serve_figures_count_lost_and_duplicated_chunks_and_the_node_left_out() -> None:
    faulted = [(["a", "c", "d"], [99.0, 101.0, 101.1]),  # "b" lost
               (["e", "f", "f", "g", "h"], [99.0, 99.1, 102.0, 102.1, 102.2])]  # "f" twice
    trial = serve_figures("serve_link_down", REFERENCE, faulted, 100.0, FAULT_NS,
                          _orchestrator(), _nodes(holder_in_new_run=False))
    assert (trial.extra["lost"], trial.extra["duplicated"]) == (1.0, 1.0)
    assert trial.extra["faulted_node_in_new_run"] == 0.0
    assert trial.extra["next_token_s"] == pytest.approx(2.0)


def test_serve_figures_name_what_the_logs_lack() -> None:
    faulted = [(REFERENCE[0], [99.0, 101.0]), (REFERENCE[1], [99.0, 101.0])]
    unrecovered = [r for r in _orchestrator() if r["event"] != "serve_recovery_completed"]
    with pytest.raises(Failed, match="no serve_recovery_completed after the fault"):
        serve_figures("serve_link_down", REFERENCE, faulted, 100.0, FAULT_NS, unrecovered,
                      _nodes(False))
    stalled = [(REFERENCE[0], [99.0, 99.5]), (REFERENCE[1], [99.0, 99.5])]
    with pytest.raises(Failed, match="no stream received a chunk after the fault"):
        serve_figures("serve_link_down", REFERENCE, stalled, 100.0, FAULT_NS,
                      _orchestrator(), _nodes(False))


def _serving(kind: str, next_s: float, lost: float) -> Trial:
    return Trial(kind, "MembershipLost", "membership", 3.0, {
        "teardown_s": 0.4, "ready_s": 4.0, "next_token_s": next_s, "lost": lost,
        "duplicated": 0.0, "phase_provision_s": 0.1, "stages_reused": 3.0})


def test_new_serving_kinds_get_count_and_detection_goals_but_no_next_token_goal() -> None:
    trials = {"serve_worker_budget": [_serving("serve_worker_budget", 40.0, 0.0)],
              "serve_link_down": [_serving("serve_link_down", 6.0, 2.0)]}
    figures = as_json(list(trials), trials, {}, 0.25)
    rows = {row["kind"]: row for row in figures["rows"]}
    assert rows["serve_worker_budget"]["fault"] == "worker kill past budget"
    assert rows["serve_worker_budget"]["spares"] == 0
    assert rows["serve_link_down"]["fault"] == "link down"
    assert rows["serve_link_down"]["spares"] == 1
    assert rows["serve_worker_budget"]["bound_s"] is None
    assert rows["serve_link_down"]["bound_s"] is not None

    goals = {row["goal"]: row for row in recovery_goals(figures)}
    budget = "[swactor serve, worker kill past budget, cold spare]"
    link = "[swactor serve, link down, warm spare]"
    assert not any("next token" in name for name in goals)  # the issue sets none here
    kept = goals[f"tokens lost over every migrated stream {budget}"]
    assert kept["verdict"] == "met"
    assert "worker kill past budget -> next token 40.00 s" in kept["note"]
    lost = goals[f"tokens lost over every migrated stream {link}"]
    assert lost["measured"]["median"] == 2.0 and lost["verdict"].startswith("missed")
    assert goals[f"tokens duplicated over every migrated stream {link}"]["verdict"] == "met"
    detect = goals[f"fault -> detection (s) [{rows['serve_link_down']['label']}]"]
    assert detect["measured"]["median"] == 3.0 and detect["verdict"] == "met"
    assert {row["recovery"]["kind"] for row in goals.values()} == set(trials)


def test_failed_streams_count_as_lost_with_the_detection_kept() -> None:
    from bench.recovery import _serving, lost_trial

    got = [["a", "b"], ["e", "f", "g", "h"]]  # stream 0 ended after 2 of 4 chunks
    trial = lost_trial("serve_worker_budget", REFERENCE, got, FAULT_NS,
                       _orchestrator(faults=4))
    assert trial is not None
    assert (trial.reason, trial.detect_s) == ("WorkerCrashed", pytest.approx(0.5))
    assert trial.extra == {"lost": 2.0, "duplicated": 0.0, "faults": 4.0,
                           "failed_streams": 1.0}
    # no recovery figure; the counts are shown
    assert _serving([trial]).split(" | ") == ["-", "-", "-", "-", "2", "0"]
    calm = [r for r in _orchestrator() if r["event"] != "run_faulted" or r["wall"] < FAULT_NS]
    assert lost_trial("serve_link_down", REFERENCE, got, FAULT_NS, calm) is None
    # the report judges them: 2 lost is a miss, not "not measured"
    figures = as_json(["serve_worker_budget"], {"serve_worker_budget": [trial]},
                      {"serve_worker_budget": "failed: Unrecovered: a stream failed"}, 0.25)
    goals = {row["goal"]: row for row in recovery_goals(figures)}
    lost = goals["tokens lost over every migrated stream "
                 "[swactor serve, worker kill past budget, cold spare]"]
    assert lost["measured"]["median"] == 2.0 and lost["verdict"].startswith("missed")
    assert "failed: Unrecovered" in lost["note"]


def test_a_spare_whose_preload_failed_is_not_called_warm() -> None:
    trial = _serving("serve_link_down", 6.0, 0.0)
    trial.extra["spare_preloaded"] = 0.0
    figures = as_json(["serve_link_down"], {"serve_link_down": [trial]}, {}, 0.25)
    (lost, _, _) = recovery_goals(figures)
    assert lost["goal"] == ("tokens lost over every migrated stream "
                            "[swactor serve, link down, spare warm for 0 of 3 stages]")
