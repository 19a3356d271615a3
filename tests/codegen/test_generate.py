"""The codegen CLI end to end: fresh repo, one-row edits, stale trees, SVGs, bad tables.

Most tests copy the fixture tables of ``fixtures/good`` into a temporary root and run
``codegen.__main__.main`` there with ``--fsm-dir`` / ``--out-root``; one runs the real
command on the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main
from tests.codegen.test_validator import _expectation

REPO = Path(__file__).resolve().parents[2]
GOOD = Path(__file__).parent / "fixtures" / "good"
MACHINE_FILES = ("swactor/fsm/generated/{m}.py", "diagrams/{m}.dot",
                 "tests/generated/test_{m}.py")


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz `dot` is not installed")


def _setup(tmp_path: Path, *, render: bool = False) -> tuple[Path, Path]:
    """Copy the good fixture tables to ``tmp/fsm`` and generate into ``tmp/out``."""
    fsm = tmp_path / "fsm"
    shutil.copytree(GOOD, fsm)
    out = tmp_path / "out"
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]
                + (["--render"] if render else [])) == 0
    return fsm, out


def test_codegen_check_is_clean_on_the_repository() -> None:
    done = subprocess.run([sys.executable, "-m", "codegen", "--check"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_help_lists_the_modes() -> None:
    done = subprocess.run([sys.executable, "-m", "codegen", "--help"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0
    for option in ("--check", "--render", "--fsm-dir", "--out-root"):
        assert option in done.stdout


@needs_dot
def test_first_run_writes_every_file_and_second_run_nothing(tmp_path: Path) -> None:
    fsm, out = _setup(tmp_path, render=True)
    expected = {f.format(m=m) for m in ("lease_desk", "toggle", "wire_mix") for f in MACHINE_FILES}
    expected |= {"swactor/fsm/generated/__init__.py", "tests/generated/__init__.py",
                 "diagrams/README.md", "diagrams/lease_desk.svg", "diagrams/toggle.svg",
                 "diagrams/wire_mix.svg", "docs/protocols/index.md"}
    first = _tree(out)
    assert set(first) == expected
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]) == 0
    assert _tree(out) == first
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 0


def test_editing_one_row_changes_only_that_machines_three_files(tmp_path: Path) -> None:
    fsm, out = _setup(tmp_path)
    before = _tree(out)
    table = fsm / "lease_desk.yaml"
    text = table.read_text(encoding="utf-8")
    row = "  - {from: Draining, event: DrainTimeout, to: Closed, fault: true}"
    assert row in text
    table.write_text(text.replace(row, row.replace("to: Closed", "to: Failed")),
                     encoding="utf-8")
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 1
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]) == 0
    after = _tree(out)
    changed = {path for path in after if after[path] != before.get(path)}
    assert changed == {f.format(m="lease_desk") for f in MACHINE_FILES}


@needs_dot
def test_check_lists_stale_missing_and_extra_files(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fsm, out = _setup(tmp_path, render=True)
    (out / "diagrams" / "toggle.dot").write_text("digraph edited {}\n", encoding="utf-8")
    (out / "tests" / "generated" / "test_toggle.py").unlink()
    (out / "swactor" / "fsm" / "generated" / "removed_table.py").write_text("", "utf-8")
    capsys.readouterr()
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: diagrams/toggle.dot" in err
    assert "missing: tests/generated/test_toggle.py" in err
    assert "extra: swactor/fsm/generated/removed_table.py" in err
    assert "stale svg (run `just diagrams`): diagrams/toggle.svg" not in err  # .dot on disk
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]) == 0
    assert not (out / "swactor" / "fsm" / "generated" / "removed_table.py").exists()
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 0


def test_a_bad_table_exits_2_naming_file_line_and_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fsm, out = _setup(tmp_path)
    shutil.copy(GOOD.parent / "broken" / "on_key.yaml", fsm / "on_key.yaml")
    before = _tree(out)
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]) == 2
    rule, _, line = _expectation(fsm / "on_key.yaml")
    assert f"{fsm / 'on_key.yaml'}:{line}: {rule}:" in capsys.readouterr().err
    assert _tree(out) == before


@needs_dot
def test_render_writes_reproducible_svgs_that_check_tracks(tmp_path: Path) -> None:
    fsm, out = _setup(tmp_path)
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 1  # no SVGs
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--render"]) == 0
    svg = (out / "diagrams" / "lease_desk.svg").read_bytes()
    assert b"Generated by graphviz" not in svg and b"dot-sha256:" in svg
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 0
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--render", "--force"]) == 0
    assert (out / "diagrams" / "lease_desk.svg").read_bytes() == svg
    table = fsm / "toggle.yaml"
    table.write_text(table.read_text("utf-8").replace("to: Gone}", "to: Gone, fault: true}"),
                     "utf-8")
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out)]) == 0
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--check"]) == 1
    assert main(["--fsm-dir", str(fsm), "--out-root", str(out), "--render"]) == 0
    assert (out / "diagrams" / "lease_desk.svg").read_bytes() == svg
