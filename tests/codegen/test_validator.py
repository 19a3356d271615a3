"""Every broken fixture table is refused with its rule, its line and its message.

Each file in ``fixtures/broken/`` is the same minimal valid table broken in one place.
Its first line says what the codegen must answer (``# expect: RULE: message fragment``)
and the line the error must point at carries the comment ``# <- here``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main
from codegen.errors import RULES, TableError
from codegen.loader import load_table
from swactor import wire

FIXTURES = Path(__file__).parent / "fixtures"
BROKEN = sorted((FIXTURES / "broken").glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, str, int]:
    lines = path.read_text(encoding="utf-8").splitlines()
    match = re.fullmatch(r"# expect: ([a-z-]+)(?:: (.*))?", lines[0])
    assert match, f"{path.name}: first line must be `# expect: RULE: message`"
    marked = [n for n, line in enumerate(lines, start=1) if line.endswith("# <- here")]
    assert len(marked) == 1, f"{path.name}: exactly one line must end with `# <- here`"
    return match.group(1), match.group(2) or "", marked[0]


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_table_is_refused(path: Path) -> None:
    rule, fragment, line = _expectation(path)
    with pytest.raises(TableError) as caught:
        load_table(path)
    error = caught.value
    assert (error.rule, error.line) == (rule, line), str(error)
    assert fragment in error.message
    assert str(error) == f"{path}:{line}: {rule}: {error.message}"


def test_every_rule_has_a_broken_fixture() -> None:
    covered = {_expectation(path)[0] for path in BROKEN}
    assert covered == RULES


def test_the_unbroken_base_table_loads(tmp_path: Path) -> None:
    source = (FIXTURES / "broken" / "duplicate_row.yaml").read_text(encoding="utf-8")
    lines = [line for line in source.splitlines() if not line.endswith("# <- here")]
    base = tmp_path / "duplicate_row.yaml"
    base.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = load_table(base)
    assert [(r.source, r.event, r.guard, r.target) for r in table.rows] == [
        ("Idle", "Go", "ready", "Busy"),
        ("Idle", "Go", "else", None),
        ("Busy", "Stop", None, "Done"),
    ]


def test_wildcard_and_list_rows_expand_and_explicit_rows_win() -> None:
    table = load_table(FIXTURES / "good" / "lease_desk.yaml")
    crash_sources = sorted(r.source for r in table.rows if r.event == "Crash")
    assert crash_sources == ["Booting", "Draining", "Ready"]  # not the terminal states
    assert [r.source for r in table.rows if r.event == "Release"] == ["Ready", "Draining"]
    assert [r.guard for r in table.groups[("Ready", "Lease")]] == [
        "fits_now", "can_ever_fit", "else"]
    assert table.outcome("Ready", "Tick") == "ignore"  # the state's own ignore list
    assert table.outcome("Booting", "Wake") == "ignore"  # the global ignore list
    assert table.outcome("Booting", "Lease") == "fault"  # the declared policy
    assert table.outcome("Closed", "Crash") == "absorb"  # terminal


def test_a_wire_message_is_the_wire_class_with_its_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = load_table(FIXTURES / "good" / "wire_mix.yaml")
    event, effect = table.events["RingQuiesced"], table.effects["WorkerReaped"]
    assert event.wire and effect.wire and not table.events["Object"].wire
    assert [(f.name, str(f.type)) for f in event.fields] == [("ring_id", "RingId")]
    assert [(f.name, str(f.type)) for f in effect.fields] == [("ring_id", "RingId")]
    assert main(["--fsm-dir", str(FIXTURES / "good"), "--out-root", str(tmp_path)]) == 0
    path = tmp_path / "swactor" / "fsm" / "generated" / "wire_mix.py"
    spec = importlib.util.spec_from_file_location("wire_mix_fixture", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "wire_mix_fixture", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    assert module.RingQuiesced is wire.RingQuiesced  # one class, no generated copy
    assert module.WorkerReaped is wire.WorkerReaped
    assert "class RingQuiesced" not in path.read_text(encoding="utf-8")


def test_explicit_row_wins_over_wildcard(tmp_path: Path) -> None:
    text = (FIXTURES / "good" / "toggle.yaml").read_text(encoding="utf-8")
    text = text.replace("  - {from: \"*\", event: Remove, to: Gone}",
                        "  - {from: Lit, event: Remove, to: Lit}\n"
                        "  - {from: \"*\", event: Remove, to: Gone}")
    path = tmp_path / "toggle.yaml"
    path.write_text(text, encoding="utf-8")
    table = load_table(path)
    assert [(r.source, r.target) for r in table.groups[("Lit", "Remove")]] == [("Lit", "Lit")]
    assert [(r.source, r.target) for r in table.groups[("Dark", "Remove")]] == [("Dark", "Gone")]
