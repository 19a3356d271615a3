"""Write ``tests/generated/test_<machine>.py``: the conformance tests of one table.

Theory of operation
-------------------
The expectations are computed here from the parsed table (``codegen.exprs`` with the
``TEST`` spelling), never from the generated machine's source, and written out as data:

* ``MATRIX``: one case per (state, event): the outcome (a row, ``ignore``, ``absorb``,
  ``raise`` or ``fault``), the guard the scripted stub answers True for, the expected
  state, the guards expected to be asked, and a lambda giving the exact effect list.
  Every row of a guarded group is one case (earlier guards answer False).
* ``PATHS``: per row, the shortest sequence of rows from the initial state to the row's
  source (breadth-first over the table), then the row itself.
* a Hypothesis differential test against ``codegen.reference.ReferenceMachine``, the
  ``transitions``-based second interpreter built at test time from the same YAML.

Event and context values are simple distinct builtins, or
``swactor.testing.examples.example(T)`` for wire types.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Any

from codegen import exprs, pretty
from codegen.fieldtypes import FieldType, WireNames
from codegen.model import Row, Table
from codegen.templating import render


class _Values:
    """Distinct simple values per field, so a copied field is told apart from another."""

    def __init__(self, base: int) -> None:
        self.counter = base

    def expr(self, ftype: FieldType, name: str) -> str:
        if ftype.kind == "optional":
            assert ftype.inner is not None
            return self.expr(ftype.inner, name)
        if ftype.kind == "tuple":
            assert ftype.inner is not None
            return f"({self.expr(ftype.inner, name)},)"
        if ftype.wire:
            return f"example(wire.{ftype.name})"
        self.counter += 1
        return {"int": str(self.counter), "float": f"{self.counter}.5", "bool": "True",
                "str": repr(f"{name}-{self.counter}")}[ftype.name]


def _effects_lambda(items: list[tuple[str, list[str]]], table: Table) -> list[str]:
    """Lines (indent 8) of ``lambda ev, ctx: [effects...],`` laid out to the limit."""
    calls = [(f"gen.{cls}" if cls in table.effects else cls, args) for cls, args in items]
    one = "        lambda ev, ctx: [" + ", ".join(
        f"{cls}({', '.join(args)})" for cls, args in calls) + "],"
    if len(one) <= pretty.LIMIT:
        return [one]
    lines = ["        lambda ev, ctx: ["]
    for cls, args in calls:
        lines += pretty.call(cls, args, ",", 12)
    return [*lines, "        ],"]


def _row_cases(table: Table, rows: list[Row], wire: WireNames) -> list[dict[str, Any]]:
    cases = []
    named = [r.guard for r in rows if r.guard not in (None, "else")]
    for position, row in enumerate(rows):
        true_guard = row.guard if row.guard not in (None, "else") else None
        asked = named[: position + 1] if true_guard else named
        cases.append({
            "state": row.source, "event": row.event, "outcome": "row",
            "true_guard": true_guard, "target": row.target or row.source, "asked": asked,
            "effects": _effects_lambda(exprs.effect_list(table, row, exprs.TEST, wire), table),
            "assign": list(row.assign),
        })
    return cases


def _matrix(table: Table, wire: WireNames) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for state in table.states:
        for event in table.events:
            outcome = table.outcome(state, event)
            if outcome == "rows":
                cases += _row_cases(table, table.groups[(state, event)], wire)
                continue
            target, effects = state, _effects_lambda([], table)
            if outcome == "fault":
                assert table.fault_state is not None
                target = table.fault_state
                items = [("ProtocolViolation", [repr(table.machine), repr(state), repr(event)])]
                items += exprs.timer_effects(table, state, target, None, exprs.TEST)
                effects = _effects_lambda(items, table)
            cases.append({"state": state, "event": event, "outcome": outcome,
                          "true_guard": None, "target": target, "asked": [],
                          "effects": effects, "assign": []})
    return cases


def _paths(table: Table, cases: list[dict[str, Any]]) -> list[tuple[str, list[int]]]:
    """Per row case: the indices into MATRIX of the steps from the initial state."""
    row_cases = [i for i, c in enumerate(cases) if c["outcome"] == "row"]
    parent: dict[str, tuple[str, int] | None] = {table.initial: None}
    queue = deque([table.initial])
    while queue:
        state = queue.popleft()
        for i in row_cases:
            case = cases[i]
            if case["state"] == state and case["target"] not in parent:
                parent[case["target"]] = (state, i)
                queue.append(case["target"])
    out = []
    for i in row_cases:
        case = cases[i]
        steps: list[int] = []
        state = case["state"]
        while (link := parent[state]) is not None:
            state, step = link
            steps.append(step)
        steps.reverse()
        guard = f"[{case['true_guard'] or 'else'}]" if case["asked"] else ""
        out.append((f"{case['state']}-{case['event']}{guard}", [*steps, i]))
    return out


def _table_line(relative: Path) -> str:
    line = f'TABLE = Path(__file__).resolve().parent / "{relative.as_posix()}"'
    return line if len(line) <= pretty.LIMIT else line + "  # noqa: E501"


def conformance_source(table: Table, wire: WireNames, fsm_dir: Path, out_root: Path) -> str:
    event_values = _Values(100)
    events = []
    for event in table.events.values():
        args = [f"{f.name}={event_values.expr(f.type, f.name)}" for f in event.fields]
        events += pretty.call(f'"{event.name}": gen.{event.name}', args, ",", 4)
    context_values = _Values(900)
    context = [f'    "{f.name}": {context_values.expr(f.type, f.name)},' for f in table.context]
    cases = _matrix(table, wire)
    matrix_lines: list[str] = []
    for case in cases:
        fields = [f'"{case["state"]}"', f'"{case["event"]}"', f'"{case["outcome"]}"',
                  repr(case["true_guard"]), f'"{case["target"]}"', repr(case["asked"]),
                  repr([list(a) for a in case["assign"]])]
        matrix_lines.append("    (")
        head = "        " + ", ".join(fields) + ","
        matrix_lines += [head] if len(head) <= pretty.LIMIT else [
            f"        {f}," for f in fields]
        matrix_lines += case["effects"]
        matrix_lines.append("    ),")
    paths = _paths(table, cases)
    path_lines: list[str] = []
    for name, steps in paths:
        one = f'    ("{name}", {steps!r}),'
        path_lines += [one] if len(one) <= pretty.LIMIT else [
            f'    ("{name}",', f"     {steps!r}),"]
    table_path = Path(os.path.relpath(fsm_dir.resolve() / f"{table.machine}.yaml",
                                      (out_root / "tests" / "generated").resolve()))
    uses_wire = any(f.type.names() for m in [*table.events.values(), *table.effects.values()]
                    for f in m.fields) or any(f.type.names() for f in table.context)
    script = []
    for guard in table.guards:
        script += [
            "",
            f"    def {guard}(self, event: object) -> bool:",
            f'        self.asked.append("{guard}")',
            f'        return "{guard}" in self.true_guards',
        ]
    effect_values = _Values(500)
    port: list[str] = []
    samples: list[str] = []
    for name, method in table.effect_methods.items():
        effect = table.effects.get(name)
        fields = [f.name for f in effect.fields] if effect is not None else [
            "machine", "state", "event"]
        quoted = [f'"{f}"' for f in fields]
        inner = f"({quoted[0]},)" if len(quoted) == 1 else f"({', '.join(quoted)})"
        one = f'    "{name}": ("{method}", {inner}),'
        if len(one) <= pretty.LIMIT:
            port.append(one)
        else:
            port += [f'    "{name}": (', f'        "{method}",',
                     *pretty.call("", quoted, ",", 8), "    ),"]
        if effect is None:
            samples.append(f'    "{name}": ProtocolViolation("m", "s", "e"),')
            continue
        args = [f"{f.name}={effect_values.expr(f.type, f.name)}" for f in effect.fields]
        samples += pretty.call(f'"{name}": gen.{name}', args, ",", 4)
    return render(
        "test_machine.py.j2", table=table, port=port, samples=samples,
        effects_cls=f"{table.class_prefix}Effects", module=f"swactor.fsm.generated.{table.machine}",
        machine_cls=f"{table.class_prefix}Machine", events=events, context=context,
        matrix=matrix_lines, paths=path_lines, table_line=_table_line(table_path),
        uses_wire=uses_wire, script=script,
        guards_line="\n".join(pretty.listing("GUARDS: list[str] = ",
                                              [f'"{g}"' for g in table.guards])),
        runtime_import=pretty.import_from("swactor.fsm.runtime", sorted({"ProtocolError"}
                               | ({"StartTimer", "CancelTimer"} if any(
                                   s.timer for s in table.states.values()) else set())
                               | ({"ProtocolViolation"} if table.unhandled == "fault"
                                  else set()))),
    )
