"""Plan, write and check every generated file of the repository.

Theory of operation
-------------------
``plan(fsm_dir, out_root)`` loads every ``fsm_dir/*.yaml`` (sorted) and returns the full
set of generated files as ``{path relative to out_root: text}``: per table the machine
module, the ``.dot`` diagram and the conformance test file, plus the two package
``__init__.py`` files, ``diagrams/README.md`` and the protocol index
``docs/protocols/index.md`` (each table's states, events, effects and guards). Output
depends only on the tables, so editing one row of one table changes only that table's
three files.

``write`` makes the tree match the plan: it rewrites files whose text differs, leaves
identical files untouched, and deletes files in the generated locations that no table
produces any more (a removed table's module, test, diagram and SVG). ``check`` reports
the same differences without touching anything, plus SVGs that are missing or were
rendered from another ``.dot`` (``codegen.svg`` embeds the ``.dot`` hash in each SVG).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from codegen.dot import dot_source
from codegen.fieldtypes import WireNames
from codegen.loader import load_table
from codegen.model import State, Table
from codegen.pymachine import module_source
from codegen.pytests import conformance_source
from codegen.svg import svg_is_fresh
from codegen.templating import render

MODULE_DIR = Path("swactor/fsm/generated")
TEST_DIR = Path("tests/generated")
DIAGRAM_DIR = Path("diagrams")
PROTOCOL_INDEX = Path("docs/protocols/index.md")

_POLICY = {"raise": "`handle()` raises ProtocolError",
           "ignore": "ignored",
           "fault": "the machine goes to its fault state"}


def load_all(fsm_dir: Path) -> list[Table]:
    wire = WireNames()
    return [load_table(path, wire) for path in sorted(fsm_dir.glob("*.yaml"))]


def plan(fsm_dir: Path, out_root: Path, tables: list[Table] | None = None) -> dict[Path, str]:
    tables = load_all(fsm_dir) if tables is None else tables
    wire = WireNames()
    files: dict[Path, str] = {}
    for table in tables:
        files[MODULE_DIR / f"{table.machine}.py"] = module_source(table, wire)
        files[DIAGRAM_DIR / f"{table.machine}.dot"] = dot_source(table)
        files[TEST_DIR / f"test_{table.machine}.py"] = conformance_source(table, wire, fsm_dir,
                                                                   out_root)
    files[MODULE_DIR / "__init__.py"] = render("generated_init.py.j2", tables=tables)
    files[TEST_DIR / "__init__.py"] = ""
    files[DIAGRAM_DIR / "README.md"] = render("diagrams_readme.md.j2", tables=[
        (t, t.doc.split("\n\n")[0].replace("\n", " ").strip()) for t in tables])
    files[PROTOCOL_INDEX] = render("protocols_index.md.j2",
                                   tables=[_index_entry(t) for t in tables])
    return files


def _cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _index_entry(table: Table) -> dict[str, object]:
    """What the protocol index shows of one table (names and state docs, not rows)."""
    def marks(state: State) -> str:
        flags = [flag for flag, on in (("initial", state.initial),
                                       ("terminal", state.terminal),
                                       ("fault", state.fault)) if on]
        return f"`{state.name}` ({', '.join(flags)})" if flags else f"`{state.name}`"

    def names(items: Iterable[str]) -> list[str]:
        return [f"`{name}`" for name in items]

    policy = _POLICY[table.unhandled]
    if table.fault_state is not None:
        policy += f" (`{table.fault_state}`)"
    return {
        "machine": table.machine, "spec": table.spec, "unhandled": table.unhandled,
        "policy": policy,
        "state_rows": [(marks(s), _cell(s.doc)) for s in table.states.values()],
        "events": names(table.events),
        "effects": names(table.effects), "guards": names(table.guards),
    }


def _generated_on_disk(out_root: Path) -> set[Path]:
    found: set[Path] = set()
    for folder, pattern in ((MODULE_DIR, "*.py"), (TEST_DIR, "*.py"), (DIAGRAM_DIR, "*.dot"),
                            (DIAGRAM_DIR, "*.svg"), (DIAGRAM_DIR, "README.md"),
                            (PROTOCOL_INDEX.parent, PROTOCOL_INDEX.name)):
        found |= {p.relative_to(out_root) for p in (out_root / folder).glob(pattern)}
    return found


@dataclass
class Report:
    stale: list[Path] = field(default_factory=list)
    missing: list[Path] = field(default_factory=list)
    extra: list[Path] = field(default_factory=list)
    svg_stale: list[Path] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.stale or self.missing or self.extra or self.svg_stale)

    def lines(self) -> list[str]:
        return ([f"stale: {p}" for p in self.stale] + [f"missing: {p}" for p in self.missing]
                + [f"extra: {p}" for p in self.extra]
                + [f"stale svg (run `just diagrams`): {p}" for p in self.svg_stale])


def check(files: dict[Path, str], out_root: Path) -> Report:
    report = Report()
    for rel, text in sorted(files.items()):
        path = out_root / rel
        if not path.exists():
            report.missing.append(rel)
        elif path.read_text(encoding="utf-8") != text:
            report.stale.append(rel)
    expected_svgs = {rel.with_suffix(".svg") for rel in files if rel.suffix == ".dot"}
    for rel in sorted(_generated_on_disk(out_root) - set(files) - expected_svgs):
        report.extra.append(rel)
    for rel in sorted(expected_svgs):
        if not svg_is_fresh(out_root / rel, files[rel.with_suffix(".dot")]):
            report.svg_stale.append(rel)
    return report


def write(files: dict[Path, str], out_root: Path) -> list[Path]:
    """Make the tree match ``files``; return the paths written or deleted."""
    changed: list[Path] = []
    for rel, text in sorted(files.items()):
        path = out_root / rel
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(rel)
        print(f"codegen: wrote {rel}", file=sys.stderr)
    expected_svgs = {rel.with_suffix(".svg") for rel in files if rel.suffix == ".dot"}
    for rel in sorted(_generated_on_disk(out_root) - set(files) - expected_svgs):
        (out_root / rel).unlink()
        changed.append(rel)
        print(f"codegen: deleted {rel}", file=sys.stderr)
    return changed
