"""`swactor.faults.table`: rows become one Markdown line each, only the marked README text
changes, and bad input is a one-line error (exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swactor.faults.table import FAULTS_BEGIN, FAULTS_END, NOT_INJECTED, main

ROW = {"source": "step failure", "injected": "worker.step raise", "outcome": "Faulted",
       "reason": "StepFailed", "component": "worker", "teardown": "Clean", "torn_down": True,
       "leases_left": 0, "orphans": 0, "next_run_ok": True, "notes": []}


def test_rows_replace_only_the_marked_text(tmp_path: Path) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([ROW, {**ROW, "source": "leaky", "leases_left": 2,
                                      "next_run_ok": False}]))
    readme = tmp_path / "README.md"
    readme.write_text(f"# head\n\n{FAULTS_BEGIN}\nold table\n{FAULTS_END}\n\ntail text\n")
    assert main([str(rows), str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# head\n\n") and text.endswith(f"{FAULTS_END}\n\ntail text\n")
    assert "old table" not in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[2] == ("| step failure | `worker.step raise` | Faulted | StepFailed (worker) "
                        "| Clean | yes | 0 | 0 | accepted |")
    assert lines[3].endswith("| 2 | 0 | REFUSED |")
    assert len(lines) == 2 + 2 + len(NOT_INJECTED)


@pytest.mark.parametrize(("content", "readme_text", "needle"), [
    ("not json", f"{FAULTS_BEGIN}\n{FAULTS_END}\n", "rows.json"),
    (json.dumps([{"source": "x"}]), f"{FAULTS_BEGIN}\n{FAULTS_END}\n", "not a list"),
    (json.dumps([ROW]), "no markers here\n", "markers"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               content: str, readme_text: str, needle: str) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(content)
    readme = tmp_path / "README.md"
    readme.write_text(readme_text)
    assert main([str(rows), str(readme)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert readme.read_text() == readme_text
