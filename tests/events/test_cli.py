"""`swactor events`: merge by wall time across files, filter, table and JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swactor.cli import main
from swactor.events import (
    Emitted,
    EventName,
    LifecycleEvent,
    NodeStarted,
    ObjectLoaded,
    RunCompleted,
)
from swactor.wire import NodeId, RunId

from .samples import sample


def write(path: Path, events: list[Emitted], extra: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(e.to_line() + "\n" for e in events) + "".join(extra))
    return path


def at(wall: int, event: LifecycleEvent, proc: str, mono: int) -> Emitted:
    return Emitted(event, mono=mono, wall=wall, pid=1000 + wall % 7, proc=proc)


def files(tmp_path: Path) -> tuple[Path, Path]:
    # monotonic clocks disagree wildly between the processes; wall times interleave
    node = write(tmp_path / "node.jsonl", [
        at(1_000, NodeStarted(node_id=NodeId(1)), "node", mono=9_000_000),
        at(3_000, sample(ObjectLoaded, run_id=7, edge_id=11, sequence=0), "node", mono=9_000_100),
        at(5_000, sample(ObjectLoaded, run_id=8, edge_id=12, sequence=1), "node", mono=9_000_200),
    ])
    orch = write(tmp_path / "orch.jsonl", [
        at(2_000, NodeStarted(node_id=NodeId(2)), "orchestrator", mono=5),
        at(3_000, RunCompleted(node_id=NodeId(2), run_id=RunId(7)), "orchestrator", mono=6),
    ])
    return node, orch


def names_and_procs(out: str) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in out.splitlines()]
    return [(row["event"], row["proc"]) for row in rows]


def test_merges_by_wall_time_with_ties_in_file_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, orch = files(tmp_path)
    assert main(["events", str(node), str(orch), "--json"]) == 0
    assert names_and_procs(capsys.readouterr().out) == [
        ("node_started", "node"),
        ("node_started", "orchestrator"),
        ("object_loaded", "node"),  # wall tie at 3000: node.jsonl was named first
        ("run_completed", "orchestrator"),
        ("object_loaded", "node"),
    ]
    assert main(["events", str(orch), str(node), "--json"]) == 0
    order = names_and_procs(capsys.readouterr().out)
    assert order[2:4] == [("run_completed", "orchestrator"), ("object_loaded", "node")]


def test_filters_by_run_edge_node_and_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, orch = files(tmp_path)
    main(["events", str(node), str(orch), "--json", "--run", "7"])
    assert names_and_procs(capsys.readouterr().out) == [
        ("object_loaded", "node"), ("run_completed", "orchestrator")
    ]
    main(["events", str(node), str(orch), "--json", "--edge", "12"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["event"], r["sequence"]) for r in rows] == [("object_loaded", 1)]
    main(["events", str(node), str(orch), "--json", "--node", "2"])
    assert {p for _, p in names_and_procs(capsys.readouterr().out)} == {"orchestrator"}
    main(["events", str(node), str(orch), "--json", "--event", "node_started",
          "--event", "run_completed"])
    assert [n for n, _ in names_and_procs(capsys.readouterr().out)] == [
        "node_started", "node_started", "run_completed"
    ]


def test_table_output_has_a_row_per_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, orch = files(tmp_path)
    assert main(["events", str(node), str(orch), "--run", "7"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["wall", "(UTC)", "proc", "event"]
    assert len(rows) == 2
    assert "object_loaded" in rows[0] and "run=7" in rows[0] and "edge=11" in rows[0]
    assert rows[0].startswith("1970-01-01T00:00:00.000Z")


def test_bad_lines_are_reported_and_skipped_or_fatal_with_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = at(1_000, NodeStarted(node_id=NodeId(1)), "node", mono=1)
    missing = good.to_json()
    del missing["node_id"]
    path = write(tmp_path / "bad.jsonl", [good], (json.dumps(missing) + "\n", '{"torn": \n'))
    assert main(["events", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1
    errors = captured.err.splitlines()
    assert errors[0].startswith(f"{path}:2: node_started: node_id: MissingIdentity")
    assert errors[1].startswith(f"{path}:3: ") and "NotJson" in errors[1]
    assert main(["events", str(path), "--strict"]) == 1


def test_unreadable_file_and_unknown_event_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", str(tmp_path / "absent.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_choice:
        main(["events", str(tmp_path / "x"), "--event", "node_exploded"])
    assert bad_choice.value.code == 2
    assert EventName.node_started.value == "node_started"


def test_registering_the_subcommand_does_not_load_the_schema() -> None:
    import subprocess
    import sys

    code = (
        "import sys, argparse\n"
        "from swactor.events import register\n"
        "register(argparse.ArgumentParser().add_subparsers())\n"
        "print('swactor.events.schema' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
