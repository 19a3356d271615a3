"""A protocol table as plain data: what each generated machine module exports as `MODEL`.

Theory of operation
-------------------
`codegen` writes, at the end of every `swactor/fsm/generated/<machine>.py`, a
`MODEL: Final = MachineModel(...)` built from the same validated table as the machine:
its states (initial, terminal, fault), events, effects, the expanded transition rows in
the order they are tried (wildcard and list `from:` rows already one row per concrete
source state), the (state, event) pairs the table ignores, and the unhandled-event
policy. The machine itself runs from its compiled `_TABLE`; `MODEL` is for tools that
reason about the table without running a binding: `swactor check` replays lifecycle
event logs through it (`swactor.check`). Names are the YAML spellings.
"""

from __future__ import annotations

from dataclasses import dataclass

Literal = int | float | str | bool | None


@dataclass(frozen=True, slots=True)
class Transition:
    """One expanded row: from `source` on `event` [if `guard`] to `target`, doing `effects`."""

    source: str
    event: str
    guard: str | None
    """A guard name, "else", or None for an unguarded row."""
    target: str | None
    """None: an internal transition (the state stays `source`)."""
    effects: tuple[str, ...]
    literals: tuple[tuple[str, str, Literal], ...] = ()
    """The row's `with:` constants: (effect, field, value; an enum member by name)."""
    fault: bool = False

    @property
    def next_state(self) -> str:
        return self.source if self.target is None else self.target

    def literal(self, effect: str, field: str) -> tuple[bool, Literal]:
        """(True, value) when the row sets `effect.field` to a constant."""
        for name, key, value in self.literals:
            if (name, key) == (effect, field):
                return True, value
        return False, None


@dataclass(frozen=True, slots=True)
class MachineModel:
    """One table: declarations, rows, ignores and the unhandled policy (module doc)."""

    machine: str
    spec: str
    initial: str
    states: tuple[str, ...]
    terminal: frozenset[str]
    fault_states: frozenset[str]
    events: tuple[str, ...]
    effects: tuple[str, ...]
    transitions: tuple[Transition, ...]
    ignored: frozenset[tuple[str, str]]
    """(state, event) pairs the state's or the table's ignore list drops (no row)."""
    unhandled: str
    """"raise", "ignore" or "fault" (to `fault_state`, effect ProtocolViolation)."""
    fault_state: str | None = None

    def rows(self, state: str, event: str) -> tuple[Transition, ...]:
        """The rows tried for `event` in `state`, in order (empty: none)."""
        return tuple(t for t in self.transitions if t.source == state and t.event == event)
