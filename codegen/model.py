"""The parsed, validated form of one ``fsm/*.yaml`` table.

Theory of operation
-------------------
``codegen.loader`` turns a YAML file into a ``Table``; every later stage (the Python,
diagram and test writers, and the ``transitions`` reference interpreter used by the
generated tests) reads only this model. Wildcard and list ``from:`` rows are already
expanded into ``Row`` objects with one concrete source state each, explicit rows having
won over wildcard ones; ``Table.groups`` maps every handled ``(state, event)`` pair to its
rows in the order they are tried. Names keep their YAML spelling; ``line`` fields point
back into the YAML for error messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from codegen.fieldtypes import FieldType

Policy = Literal["raise", "ignore", "fault"]
Scalar = int | float | str | bool | None

VIOLATION_METHOD = "protocol_violation"
"""The effects-port method of the built-in ProtocolViolation (``unhandled: fault``)."""

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*")


def effect_method(effect: str) -> str:
    """The effects-port method of an effect: ``StopPump`` -> ``stop_pump``."""
    return "_".join(word.lower() for word in _WORD.findall(effect))


@dataclass(frozen=True, slots=True)
class Field:
    """A typed, documented field of an event, effect or the context."""

    name: str
    type: FieldType
    doc: str
    line: int


@dataclass(frozen=True, slots=True)
class Timer:
    """A state timer: armed on entry, cancelled on exit, fires ``event``."""

    event: str
    after: str | float
    """A context field name, or a number of seconds."""
    line: int


@dataclass(frozen=True, slots=True)
class State:
    """A declared state with its flags, optional timer and own ignore list."""

    name: str
    doc: str
    line: int
    initial: bool = False
    terminal: bool = False
    fault: bool = False
    timer: Timer | None = None
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Message:
    """An event or an effect declaration."""

    name: str
    doc: str
    line: int
    fields: tuple[Field, ...] = ()
    wire: bool = False
    """The class is ``swactor.wire.<name>`` (``wire: true``), shared with every table and
    component that names the same fact; ``fields`` are read from it."""

    def field(self, name: str) -> Field | None:
        for candidate in self.fields:
            if candidate.name == name:
                return candidate
        return None


@dataclass(frozen=True, slots=True)
class Guard:
    """A named pure predicate the binding answers for a row's event."""

    name: str
    doc: str
    line: int


@dataclass(frozen=True, slots=True)
class Row:
    """One expanded transition row with a single concrete source state."""

    source: str
    event: str
    guard: str | None
    """A guard name, ``"else"``, or None for an unguarded row."""
    target: str | None
    """None: an internal transition (state and timers unchanged)."""
    effects: tuple[str, ...]
    with_values: tuple[tuple[str, str, Scalar], ...]
    """(effect, field, literal) constants."""
    assign: tuple[tuple[str, str], ...]
    """(context field, event field) updates applied before effects are built."""
    fault: bool
    doc: str
    line: int
    wildcard: bool
    index: int
    """Position of the YAML row this came from (0-based), for stable ordering."""

    def literal(self, effect: str, field_name: str) -> tuple[bool, Scalar]:
        for eff, fld, value in self.with_values:
            if eff == effect and fld == field_name:
                return True, value
        return False, None


@dataclass(slots=True)
class Table:
    """One validated table: declarations, expanded rows and their groups."""

    machine: str
    spec: str
    doc: str
    path: str
    sha256: str
    unhandled: Policy
    fault_state: str | None
    ignore: tuple[str, ...]
    context: tuple[Field, ...]
    states: dict[str, State]
    events: dict[str, Message]
    effects: dict[str, Message]
    guards: dict[str, Guard]
    rows: list[Row] = field(default_factory=list)
    groups: dict[tuple[str, str], list[Row]] = field(default_factory=dict)

    @property
    def class_prefix(self) -> str:
        """``arena_manager`` -> ``ArenaManager``."""
        return "".join(part.capitalize() for part in self.machine.split("_"))

    @property
    def effect_methods(self) -> dict[str, str]:
        """Effect name -> its ``<Prefix>Effects`` method, ProtocolViolation included
        under the ``fault`` policy (the binding decides what a violation does)."""
        methods = {name: effect_method(name) for name in self.effects}
        if self.unhandled == "fault":
            methods["ProtocolViolation"] = VIOLATION_METHOD
        return methods

    @property
    def initial(self) -> str:
        return next(s.name for s in self.states.values() if s.initial)

    def context_field(self, name: str) -> Field | None:
        for candidate in self.context:
            if candidate.name == name:
                return candidate
        return None

    def ignored(self, state: str, event: str) -> bool:
        """True when ``event`` is on the state's or the global ignore list (no row)."""
        return (state, event) not in self.groups and (
            event in self.states[state].ignore or event in self.ignore
        )

    def outcome(self, state: str, event: str) -> str:
        """What the machine does with ``event`` in ``state``: rows/ignore/absorb/policy."""
        if self.states[state].terminal:
            return "absorb"
        if (state, event) in self.groups:
            return "rows"
        if self.ignored(state, event):
            return "ignore"
        return self.unhandled
