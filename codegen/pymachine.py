"""Write ``swactor/fsm/generated/<machine>.py`` for one table.

Theory of operation
-------------------
The module is rendered from ``templates/machine.py.j2``; this file prepares the pieces
as lists of already laid-out source lines (see ``codegen.pretty``) so the template only
places them. The design follows h11's ``_state.py``: the protocol is *data*, one
module-level ``_TABLE`` mapping ``(State, event class)`` to the rows tried in order, each
row ``(guard adapter | None, target State | None, effect builder)``. Ignored pairs map to
``_IGNORED``. ``handle()`` does one dict lookup, calls guards until one answers True (a
guarded group always ends with an unconditional ``else`` row), runs the row's builder
(which applies ``assign:`` then returns the fresh effect list) and moves the state.
Pairs absent from ``_TABLE`` go to ``_unhandled``: terminal states absorb, else the
table's policy. Builders are deduplicated by their text, so a wildcard row expanded
onto many states shares one function unless timers make the effect lists differ.
"""

from __future__ import annotations

import re
from typing import Any

from codegen import exprs, pretty
from codegen.fieldtypes import WireNames
from codegen.model import Message, Row, Table
from codegen.templating import render


def _message_class(msg: Message, kind: str) -> list[str]:
    lines = ["@dataclass(frozen=True, slots=True)", f"class {msg.name}:"]
    lines += pretty.docstring(msg.doc, 4)
    if msg.fields:
        lines.append("")
    for fld in msg.fields:
        lines.append(f"    {fld.name}: {fld.type.python()}")
        lines += pretty.docstring(fld.doc, 4)
    if not msg.fields:
        return lines
    # A frozen dataclass's own __init__ costs one object.__setattr__ call per field; the
    # slot descriptors' setters, bound once below the class, are a third faster.
    params = ["self", *(f"{f.name}: {f.type.python()}" for f in msg.fields)]
    lines.append("")
    lines += pretty.call("def __init__", params, " -> None:", 4)
    lines += [f"        _set_{msg.name}_{f.name}(self, {f.name})" for f in msg.fields]
    lines.append("")
    lines.append("")
    for f in msg.fields:
        lines += pretty.call(f"_set_{msg.name}_{f.name} = slot_setter",
                             [msg.name, f'"{f.name}"'], "", 0)
    return lines


_ENUM_LITERAL = re.compile(r"wire\.[A-Za-z_]\w*\.[A-Za-z_]\w*")


class _Constants:
    """Effects whose every field is a literal, built once at import (effects are frozen),
    and enum members used as literals, looked up once at import."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # constructor call text -> constant name
        self.members: dict[str, str] = {}  # ``wire.Enum.Member`` -> constant name

    def name_for(self, cls: str, args: list[str]) -> str | None:
        if any("event." in arg or "m._" in arg for arg in args):
            return None
        call = f"{cls}({', '.join(args)})"
        return self.names.setdefault(call, f"_EFFECT_{len(self.names)}")

    def literal(self, arg: str) -> str:
        """``field=wire.Enum.Member`` -> ``field=_MEMBER_n`` (saves two lookups per use)."""
        name, sep, value = arg.partition("=")
        if not sep or not _ENUM_LITERAL.fullmatch(value):
            return arg
        return f"{name}={self.members.setdefault(value, f'_MEMBER_{len(self.members)}')}"

    def lines(self) -> list[str]:
        out = [f"{name}: Final = {value}" for value, name in self.members.items()]
        for call, name in self.names.items():
            out += pretty.call(f"{name}: Final = {call.split('(', 1)[0]}",
                               _split_args(call), "", 0)
        return out


def _split_args(call: str) -> list[str]:
    inner = call.split("(", 1)[1][:-1]
    return [inner] if inner else []


def _effect_lines(items: list[tuple[str, list[str]]], indent: int,
                  constants: _Constants) -> list[str]:
    if not items:
        return [" " * indent + "return []"]
    parts: list[tuple[str, list[str]] | str] = []
    for cls, args in items:
        constant = constants.name_for(cls, args)
        parts.append(constant if constant is not None
                     else (cls, [constants.literal(arg) for arg in args]))
    texts = [p if isinstance(p, str) else f"{p[0]}({', '.join(p[1])})" for p in parts]
    one = " " * indent + f"return [{', '.join(texts)}]"
    if len(one) <= pretty.LIMIT:
        return [one]
    lines = [" " * indent + "return ["]
    for part in parts:
        if isinstance(part, str):
            lines.append(" " * (indent + 4) + part + ",")
        else:
            lines += pretty.call(part[0], part[1], ",", indent + 4)
    lines.append(" " * indent + "]")
    return lines


def _builder_body(table: Table, row: Row, wire: WireNames, constants: _Constants) -> list[str]:
    body = [f"    m._{ctx} = event.{field}" for ctx, field in row.assign]
    items = exprs.effect_list(table, row, exprs.MACHINE, wire)
    return body + _effect_lines(items, 4, constants)


def module_source(table: Table, wire: WireNames) -> str:
    prefix = table.class_prefix
    machine_cls, guards_cls = f"{prefix}Machine", f"{prefix}Guards"

    constants = _Constants()
    builders: dict[str, str] = {}  # body text -> function name
    builder_defs: list[list[str]] = []
    row_builder: dict[int, str] = {}
    for position, row in enumerate(table.rows):
        body = _builder_body(table, row, wire, constants)
        summary = _row_summary(row)
        key = f"{row.event}\n{summary}\n" + "\n".join(body)
        if key not in builders:
            name = f"_row_{len(builders)}"
            builders[key] = name
            head = f"def {name}(m: {machine_cls}, event: {row.event}) -> list[Effect]:"
            if len(head) > pretty.LIMIT:
                head = (f"def {name}(\n    m: {machine_cls}, event: {row.event}\n"
                        ") -> list[Effect]:")
            builder_defs.append(head.split("\n") + pretty.docstring(summary, 4) + body)
        row_builder[position] = builders[key]

    guard_events: dict[str, list[str]] = {g: [] for g in table.guards}
    for row in table.rows:
        if row.guard in guard_events and row.event not in guard_events[row.guard]:
            guard_events[row.guard].append(row.event)
    guard_methods: list[list[str]] = []
    guard_adapters: list[list[str]] = []
    for guard in table.guards.values():
        events = guard_events[guard.name] or ["Event"]
        param = " | ".join(events)
        head = f"    def {guard.name}(self, event: {param}) -> bool:"
        head_lines = [head]
        if len(head) > pretty.LIMIT:
            union = pretty.union(events, 8, "event: ")
            union[-1] += ","
            head_lines = [f"    def {guard.name}(", "        self,", *union, "    ) -> bool:"]
        guard_methods.append(head_lines + pretty.docstring(guard.doc, 8) + ["        ..."])
        adapter = f"def _guard_{guard.name}(guards: {guards_cls}, event: Any) -> bool:"
        if len(adapter) > pretty.LIMIT:
            adapter = (f"def _guard_{guard.name}(\n    guards: {guards_cls}, event: Any\n"
                       ") -> bool:")
        guard_adapters.append(adapter.split("\n") + [f"    return guards.{guard.name}(event)"])

    table_lines: list[str] = []
    order = list(table.states)
    events_order = list(table.events)
    entries: dict[tuple[str, str], list[str]] = {}
    for position, row in enumerate(table.rows):
        guard_ref = f"_guard_{row.guard}" if row.guard not in (None, "else") else "None"
        target = f"State.{row.target}" if row.target else "None"
        entries.setdefault((row.source, row.event), []).append(
            f"({guard_ref}, {target}, {row_builder[position]}),")
    ignored = [(s, e) for s in order for e in events_order if table.outcome(s, e) == "ignore"]
    for pair in sorted(list(entries) + ignored,
                       key=lambda k: (order.index(k[0]), events_order.index(k[1]))):
        lead = f"    (State.{pair[0]}, {pair[1]}): "
        if pair in entries:
            row_texts = entries[pair]
            one = f"{lead}({row_texts[0]}),"
            if len(row_texts) == 1 and len(one) <= pretty.LIMIT:
                table_lines.append(one)
            else:
                table_lines.append(lead + "(")
                table_lines += [f"        {r}" for r in row_texts]
                table_lines.append("    ),")
        else:
            table_lines.append(f"{lead}_IGNORED,")

    effect_names = list(table.effects)
    timed = {s.name: s.timer for s in table.states.values() if s.timer is not None}
    if timed:
        effect_names += ["StartTimer", "CancelTimer"]
    if table.unhandled == "fault":
        effect_names.append("ProtocolViolation")
    runtime_imports = sorted({"ProtocolError"} | set(effect_names) - set(table.effects)
                             | ({"slot_setter"} if any(m.fields for m in [
                                 *table.events.values(), *table.effects.values()]) else set()))

    fault_lines: list[str] = []
    if table.unhandled == "fault":
        assert table.fault_state is not None
        fault_lines.append("        effects: list[Effect] = "
                           "[ProtocolViolation(MACHINE, self._state.name, name)]")
        if timed:
            fault_lines += ["        timer = _TIMERS.get(self._state)",
                            "        if timer is not None:",
                            "            effects.append(CancelTimer(timer))"]
        fault_timer = table.states[table.fault_state].timer
        if fault_timer is not None:
            seconds = exprs.timer_seconds(table, table.fault_state, None, exprs.MACHINE)
            fault_lines.append(f'        effects.append(StartTimer("{fault_timer.event}", '
                               f'{seconds.replace("m._", "self._")}))')
        fault_lines.append(f"        self._state = State.{table.fault_state}")

    wire_used = sorted({n for m in [*table.events.values(), *table.effects.values()]
                        for f in m.fields for n in f.type.names()}
                       | {n for f in table.context for n in f.type.names()})
    terminal = [s.name for s in table.states.values() if s.terminal]
    context: dict[str, Any] = {
        "table": table,
        "doc": pretty.docstring(table.doc, 0),
        "machine_cls": machine_cls,
        "guards_cls": guards_cls,
        "uses_wire": bool(wire_used),
        "runtime_import": pretty.import_from("swactor.fsm.runtime", runtime_imports),
        "states": [(s.name, pretty.docstring(s.doc, 4)) for s in table.states.values()],
        "events": [_message_class(m, "event") for m in table.events.values()],
        "effects": [_message_class(m, "effect") for m in table.effects.values()],
        "event_union": pretty.union(list(table.events), 0, "Event: TypeAlias = "),
        "effect_union": (pretty.union(effect_names, 0, "Effect: TypeAlias = ")
                         if effect_names else ["Effect: TypeAlias = Never"]),
        "never": not effect_names,
        "guard_methods": guard_methods,
        "guard_adapters": guard_adapters,
        "builders": builder_defs,
        "constants": constants.lines(),
        "table_lines": table_lines,
        "has_ignored": bool(ignored),
        "event_list": list(table.events),
        "terminal": terminal,
        "timed": [(name, timer.event) for name, timer in timed.items()],
        "timer_events": sorted({t.event for t in timed.values()}),
        "fault_lines": fault_lines,
        "guards_doc": pretty.docstring(
            f"The guards of {table.machine}: pure predicates the binding answers. "
            "Each guard is asked only for its row's event, in row order.", 4),
        "machine_doc": pretty.docstring(
            f"The {table.machine} machine ({table.spec}). Feed events to ``handle()``; "
            "carry out the effects it returns.", 4),
        "handle_doc": pretty.docstring(
            "Apply one event: move the state and return the effects to carry out. "
            f"Unhandled events: policy ``{table.unhandled}``; terminal states absorb.", 8),
        "context_params": [f"        {f.name}: {f.type.python()}," for f in table.context],
        "context_props": [(f.name, f.type.python(), pretty.docstring(f.doc, 8))
                          for f in table.context],
        "slots": pretty.call("__slots__ = ", [f'"_{n}"' for n in
                                                ["guards", "state", "events", *(f.name for f in
                                                                      table.context)]],
                             "", 4),
    }
    return render("machine.py.j2", **context)


def _row_summary(row: Row) -> str:
    guard = f" [{row.guard}]" if row.guard else ""
    target = f" -> {row.target}" if row.target else " (internal)"
    return f"{row.event}{guard}{target}: {', '.join(row.effects) or 'no effects'}."
