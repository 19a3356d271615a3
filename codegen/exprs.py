"""Python expressions for what a row produces, spelled for the machine or for its tests.

Theory of operation
-------------------
The machine writer and the test writer both need "the effect list of this row" as
source text, but from different vantage points: the generated machine reads the event
as ``event`` and its context as ``m._field`` (after the row's ``assign:`` has run); the
generated test reads the event as ``ev`` and the context from its own ``ctx`` dict,
substituting the event field for an assigned context field. ``effect_list`` takes a
``Spelling`` for either side, so both are produced by the same rules of the schema
(``with:`` literal, else event field of the same name, else context field) while the
test never looks at the generated machine's code. Order: the row's effects, then
``CancelTimer`` for a timed state left, then ``StartTimer`` for a timed state entered.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.fieldtypes import FieldType, WireNames
from codegen.model import Row, Scalar, Table


@dataclass(frozen=True, slots=True)
class Spelling:
    """How an expression names the event and the context."""

    event: str
    """Name of the event variable."""
    machine_side: bool
    """True: context is ``m._name``; False: ``ctx["name"]`` with assigns substituted."""


MACHINE = Spelling("event", True)
TEST = Spelling("ev", False)


def literal(ftype: FieldType, value: Scalar, wire: WireNames) -> str:
    """Source text of a ``with:`` literal for a field of type ``ftype``."""
    if value is None:
        return "None"
    base = ftype.inner if ftype.kind == "optional" and ftype.inner is not None else ftype
    if base.wire and wire.enum_members(base.name) is not None:
        return f"wire.{base.name}.{value}"
    if base.name == "float":
        return repr(float(value))
    return repr(value)


def context_value(name: str, row: Row | None, spell: Spelling) -> str:
    if spell.machine_side:
        return f"m._{name}"
    for ctx_name, event_field in row.assign if row is not None else ():
        if ctx_name == name:
            return f"{spell.event}.{event_field}"
    return f'ctx["{name}"]'


def effect_args(table: Table, row: Row, effect: str, spell: Spelling,
                wire: WireNames) -> list[str]:
    args: list[str] = []
    event = table.events[row.event]
    for fld in table.effects[effect].fields:
        found, value = row.literal(effect, fld.name)
        if found:
            args.append(f"{fld.name}={literal(fld.type, value, wire)}")
        elif event.field(fld.name) is not None:
            args.append(f"{fld.name}={spell.event}.{fld.name}")
        elif table.context_field(fld.name) is not None:
            args.append(f"{fld.name}={context_value(fld.name, row, spell)}")
        else:  # an optional field with no source (the loader checked)
            args.append(f"{fld.name}=None")
    return args


def timer_seconds(table: Table, state: str, row: Row | None, spell: Spelling) -> str:
    timer = table.states[state].timer
    assert timer is not None
    if isinstance(timer.after, str):
        return context_value(timer.after, row, spell)
    return repr(timer.after)


def timer_effects(table: Table, source: str, target: str | None, row: Row | None,
                  spell: Spelling) -> list[tuple[str, list[str]]]:
    """(class, args) of the timer effects of moving ``source`` -> ``target``."""
    if target is None:
        return []
    out: list[tuple[str, list[str]]] = []
    left = table.states[source].timer
    if left is not None:
        out.append(("CancelTimer", [f'"{left.event}"']))
    entered = table.states[target].timer
    if entered is not None:
        out.append(("StartTimer", [f'"{entered.event}"',
                                   timer_seconds(table, target, row, spell)]))
    return out


def effect_list(table: Table, row: Row, spell: Spelling,
                wire: WireNames) -> list[tuple[str, list[str]]]:
    """(class, args) of every effect the row produces, in order."""
    out = [(name, effect_args(table, row, name, spell, wire)) for name in row.effects]
    return out + timer_effects(table, row.source, row.target, row, spell)
