"""The event-order checker used by the cluster tests accepts a legal run and names each
kind of violation (fast; synthetic records)."""

from __future__ import annotations

from typing import Any

from tests.cluster.event_order import check_run_order

RUN = 5


def _rec(proc: str, event: str, wall: int, **fields: Any) -> dict[str, Any]:
    return {"proc": proc, "event": event, "wall": wall, **fields}


def legal() -> list[dict[str, Any]]:
    o, n = "orchestrator-x", "node-a"
    run = {"run_id": RUN}
    return [
        _rec(n, "node_started", 1), _rec(n, "node_available", 2),
        _rec(o, "pool_ready", 3), _rec(o, "run_planned", 4, **run),
        _rec(o, "stage_provision_started", 5, **run),
        _rec(n, "weights_download_started", 6, **run),
        _rec(n, "edge_provision_started", 7, **run), _rec(n, "edge_ready", 8, **run),
        _rec(n, "weights_downloaded", 9, **run), _rec(n, "weights_loaded", 10, **run),
        _rec(n, "stage_ready", 11, **run),
        _rec(o, "readiness_barrier_passed", 12, **run), _rec(o, "prompt_injected", 13, **run),
        _rec(n, "object_loaded", 14, sequence=0, **run),
        _rec(n, "execute_step_started", 15, **run),
        _rec(n, "object_produced", 16, sequence=0, **run),
        _rec(n, "step_completed", 17, **run),
        _rec(o, "token_received", 18, sequence=0, **run),
        _rec(o, "run_completed", 19, **run), _rec(o, "stop_run_sent", 20, **run),
        _rec(n, "stage_stopped", 21, **run), _rec(o, "run_torn_down", 22, **run),
    ]


def test_a_legal_run_passes() -> None:
    assert check_run_order(legal(), RUN) == []


def test_each_violation_is_named() -> None:
    records = legal()
    swapped = [r for r in records if r["event"] != "edge_ready"]
    swapped.insert(swapped.index(next(r for r in swapped if r["event"] == "stage_ready")) + 1,
                   _rec("node-a", "edge_ready", 11, run_id=RUN))
    assert check_run_order(swapped, RUN) == ["node-a run 5: edge_ready after stage_ready"]

    missing = [r for r in records if r["event"] != "prompt_injected"]
    assert "orchestrator: missing prompt_injected" in check_run_order(missing, RUN)

    late = [dict(r, wall=99) if r["event"] == "stage_ready" else r for r in records]
    assert "node-a run 5: stage_ready after the readiness barrier" in check_run_order(late, RUN)

    tail = [*records, _rec("orchestrator-x", "token_received", 30, sequence=1, run_id=RUN)]
    problems = check_run_order(tail, RUN)
    assert "orchestrator: run_torn_down is not last" in problems
    assert "orchestrator: token_received after run_completed" in problems

    assert check_run_order(records, RUN + 1) == [f"orchestrator: no event of run {RUN + 1}"]
