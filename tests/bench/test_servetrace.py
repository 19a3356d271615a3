"""`bench serve --trace`'s arithmetic: a window's figures from scripted event lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench._servetrace import read_events, trace_line, window_figures

MS = 1_000_000


def _step(stage: int, sequence: int, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    base = {"run_id": 7, "stage_index": stage, "sequence": sequence}
    return [{**base, "event": "execute_step_started", "mono": start_ms * MS},
            {**base, "event": "step_completed", "mono": end_ms * MS}]


def _out(at_ms: int, rows: int, in_flight: int) -> dict[str, Any]:
    return {"event": "token_received", "mono": at_ms * MS, "run_id": 7,
            "detail": {"rows": rows, "in_flight": in_flight}}


def test_busy_share_is_clipped_to_the_window_and_steps_count_where_they_end() -> None:
    events = [*_step(0, 0, 0, 20),      # half inside: 10 ms busy, ends inside
              *_step(0, 1, 30, 40),     # inside
              *_step(0, 2, 95, 130),    # starts inside, ends after: 5 ms busy, not counted
              *_step(1, 0, 200, 210)]   # after the window: not there at all
    figures = window_figures(events, 10 * MS, 100 * MS)
    assert figures.window_s == 0.09
    assert list(figures.stages) == [0]
    stage = figures.stages[0]
    assert stage.steps == 2
    assert abs(stage.busy - 25 / 90) < 1e-9
    assert stage.median_step_ms == 15.0


def test_rows_per_decode_object_and_objects_in_flight() -> None:
    events = [_out(5, 0, 4), _out(20, 0, 4), _out(30, 2, 2), _out(40, 1, 3),
              _out(50, 2, 2), _out(500, 2, 2)]  # the last is after the window
    figures = window_figures(events, 0, 100 * MS)
    assert (figures.outputs, figures.prompts, figures.decode_objects) == (5, 2, 3)
    assert figures.rows_per_decode_object == 5 / 3
    assert figures.in_flight == {2: 2, 3: 1, 4: 2}
    assert figures.mean_in_flight == (4 + 3 + 8) / 5
    line = trace_line(figures)
    assert "rows per decode object 1.67" in line and "(2:2 3:1 4:2)" in line


def test_outputs_without_detail_count_but_say_nothing_of_rows() -> None:
    figures = window_figures([{"event": "token_received", "mono": 5}], 0, 10)
    assert figures.outputs == 1
    assert figures.rows_per_decode_object is None and figures.mean_in_flight is None
    assert "n/a" in trace_line(figures)


def test_read_events_skips_torn_and_foreign_lines(tmp_path: Path) -> None:
    (tmp_path / "node-0.jsonl").write_text(
        json.dumps({"event": "step_completed", "mono": 3}) + "\n{\"event\": \"torn\n")
    (tmp_path / "orchestrator.jsonl").write_text("[1, 2]\n" + json.dumps(
        {"event": "token_received", "mono": 4}) + "\n")
    (tmp_path / "notes.txt").write_text("not events\n")
    assert [e["mono"] for e in read_events(tmp_path)] == [3, 4]


def _mark(name: str, stage: int, sequence: int, at_ms: int) -> dict[str, Any]:
    return {"event": name, "run_id": 7, "stage_index": stage, "sequence": sequence,
            "mono": at_ms * MS}


def _back(sequence: int, at_ms: int, rows: int, in_flight: int) -> dict[str, Any]:
    return {**_out(at_ms, rows, in_flight), "sequence": sequence}


def test_hops_of_lone_objects_beside_the_stage_to_stage_hop() -> None:
    events = [
        # step 0 travels alone: stage 0 -> 1 in 2 ms, back in 1 ms, step 1 loaded 3 ms on
        _mark("object_loaded", 0, 0, 0), _mark("object_produced", 0, 0, 10),
        _mark("object_loaded", 1, 0, 12), _mark("object_produced", 1, 0, 20),
        _back(0, 21, 1, 1), _mark("object_loaded", 0, 1, 24),
        # step 1: stage 0 -> 1 in 4 ms, back in 3 ms; then a prompt: no forward hop
        _mark("object_produced", 0, 1, 30), _mark("object_loaded", 1, 1, 34),
        _mark("object_produced", 1, 1, 40), _back(1, 43, 1, 1),
        _mark("object_loaded", 0, 2, 60), _back(2, 90, 0, 1),
        # step 3 came back beside another object: its hops are left out
        _mark("object_produced", 0, 3, 100), _mark("object_loaded", 1, 3, 150),
        _back(3, 160, 2, 2),
    ]
    figures = window_figures(events, 0, 200 * MS)
    assert figures.hops_ms == {"stage_to_stage": 3.0, "to_orchestrator": 2.0,
                               "orchestrator_to_stage0": 3.0}
    assert ("hops of lone objects (median): stage -> stage 3.00 ms, last stage -> "
            "orchestrator 2.00 ms, orchestrator -> stage 0 3.00 ms") in trace_line(figures)
    assert window_figures(events, 0, 10 * MS).hops_ms == {}
    assert "hops" not in trace_line(window_figures(events, 0, 10 * MS))


def test_stages_computing_at_once_and_prefills_alone() -> None:
    outputs = [{"event": "token_received", "mono": 90 * MS, "run_id": 7, "sequence": 0,
                "detail": {"rows": 0, "in_flight": 2}},  # a prompt
               {"event": "token_received", "mono": 95 * MS, "run_id": 7, "sequence": 1,
                "detail": {"rows": 1, "in_flight": 1}}]  # a decode row
    events = [*outputs, *_step(0, 0, 0, 40), *_step(1, 1, 10, 20), *_step(1, 0, 40, 60),
              *_step(0, 1, 50, 55)]
    figures = window_figures(events, 0, 100 * MS)
    assert {k: round(v, 6) for k, v in figures.computing.items()} == {
        0: 0.40, 1: 0.45, 2: 0.15}
    assert abs(figures.prefills_alone - 0.45) < 1e-9  # 0-10, 20-50, 55-60 ms
    assert figures.mean_computing is not None and abs(figures.mean_computing - 0.75) < 1e-9
    assert ("stages computing at once 0.75 (0:40% 1:45% 2:15%), only prefills "
            "computing 45%") in trace_line(figures)
    empty = window_figures([], 0, 10 * MS)
    assert empty.computing == {0: 1.0} and empty.prefills_alone == 0.0
