"""The independent second interpreter: a ``transitions.Machine`` built from a YAML table.

Theory of operation
-------------------
Generated conformance tests compare every generated machine with this one on
Hypothesis-drawn event sequences. It shares only the loader with the codegen (wildcard
and list rows arrive expanded, explicit rows having won) and interprets the table
through ``transitions`` (``auto_transitions=False``, ``send_event=True``):

* each row is a transition on trigger = event class name, from its state to ``to:``
  (``dest=None`` for an internal row), its guard a condition asking the scripted guards
  object, rows added in table order so ``transitions`` tries them in that order;
* the row's ``assign:`` and effects run in its ``before`` callback (which runs only for
  the transition taken), a timed state's ``on_exit`` records ``CancelTimer`` and its
  ``on_enter`` records ``StartTimer``: so the order is effects, cancel, start;
* ignored pairs are internal transitions without effects; terminal states absorb;
  anything else follows the policy: ``raise`` -> the string ``"raise"``, ``ignore`` ->
  ``[]``, ``fault`` -> a ``_unhandled`` trigger to the fault state recording
  ``ProtocolViolation``.

Effect objects are built from the generated module's classes by name, with fields
resolved by the schema's rule (``with:``, event field, context field).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from transitions import Machine, MachineError
from transitions import State as TState

from codegen.fieldtypes import FieldType
from codegen.loader import load_table
from codegen.model import Row, Scalar, Table
from swactor.fsm.runtime import CancelTimer, ProtocolViolation, StartTimer

_UNHANDLED = "_unhandled"


@functools.lru_cache(maxsize=64)
def _table(path: str) -> Table:
    return load_table(Path(path))


class _Model:
    """The object ``transitions`` decorates with triggers and ``state``."""

    state: str


class ReferenceMachine:
    """A ``transitions``-driven interpreter of one table, answering like ``handle()``."""

    def __init__(self, table_path: Path, module: ModuleType, guards: object,
                 context: Mapping[str, object]) -> None:
        self.table = _table(str(table_path))
        self._module = module
        self._guards = guards
        self._ctx: dict[str, object] = dict(context)
        self._effects: list[object] = []
        self._model = _Model()
        table = self.table
        states = []
        for state in table.states.values():
            kwargs: dict[str, Any] = {}
            if state.timer is not None:
                kwargs["on_enter"] = [functools.partial(self._start, state.name)]
                kwargs["on_exit"] = [functools.partial(self._cancel, state.name)]
            states.append(TState(state.name, **kwargs))
        self._machine = Machine(model=self._model, states=states, initial=table.initial,
                                auto_transitions=False, send_event=True,
                                ignore_invalid_triggers=False)
        for row in table.rows:
            conditions: list[Any] = ([functools.partial(self._ask, row.guard)]
                                     if row.guard not in (None, "else") else [])
            self._machine.add_transition(row.event, row.source, row.target,
                                         conditions=conditions,
                                         before=[functools.partial(self._run_row, row)])
        for state_name in table.states:
            for event in table.events:
                if table.outcome(state_name, event) == "ignore":
                    self._machine.add_transition(event, state_name, None)
        if table.unhandled == "fault":
            live: list[Any] = [s.name for s in table.states.values() if not s.terminal]
            self._machine.add_transition(_UNHANDLED, live, table.fault_state,
                                         before=[self._violation])

    @property
    def state(self) -> str:
        return self._model.state

    def handle(self, event: object) -> list[object] | str:
        """The effects of ``event``, or ``"raise"`` where ``handle()`` must raise."""
        name = type(event).__name__
        state = self._model.state
        self._effects = []
        if name not in self.table.events:
            return "raise"
        if self.table.states[state].terminal:
            return []
        try:
            if name not in self._machine.events:
                raise MachineError(name)
            self._model.trigger(name, event=event)  # type: ignore[attr-defined]
        except MachineError:
            if self.table.unhandled == "raise":
                return "raise"
            if self.table.unhandled == "ignore":
                return []
            self._model.trigger(_UNHANDLED, event=event)  # type: ignore[attr-defined]
        return self._effects

    # -- callbacks ----------------------------------------------------------------

    def _ask(self, guard: str, event_data: Any) -> bool:
        answer: bool = getattr(self._guards, guard)(event_data.kwargs["event"])
        return answer

    def _run_row(self, row: Row, event_data: Any) -> None:
        event = event_data.kwargs["event"]
        for ctx_name, event_field in row.assign:
            self._ctx[ctx_name] = getattr(event, event_field)
        for effect_name in row.effects:
            fields: dict[str, object] = {}
            for fld in self.table.effects[effect_name].fields:
                found, value = row.literal(effect_name, fld.name)
                if found:
                    fields[fld.name] = _literal(fld.type, value)
                elif self.table.events[row.event].field(fld.name) is not None:
                    fields[fld.name] = getattr(event, fld.name)
                else:  # the context's field, or None for an optional one with no source
                    fields[fld.name] = self._ctx.get(fld.name)
            self._effects.append(getattr(self._module, effect_name)(**fields))

    def _start(self, state: str, event_data: Any) -> None:
        timer = self.table.states[state].timer
        assert timer is not None
        seconds = self._ctx[timer.after] if isinstance(timer.after, str) else timer.after
        self._effects.append(StartTimer(timer.event, float(seconds)))  # type: ignore[arg-type]

    def _cancel(self, state: str, event_data: Any) -> None:
        timer = self.table.states[state].timer
        assert timer is not None
        self._effects.append(CancelTimer(timer.event))

    def _violation(self, event_data: Any) -> None:
        self._effects.append(ProtocolViolation(self.table.machine, event_data.state.name,
                                               type(event_data.kwargs["event"]).__name__))


def _literal(ftype: FieldType, value: Scalar) -> object:
    if value is None:
        return None
    base = ftype.inner if ftype.kind == "optional" and ftype.inner is not None else ftype
    if base.wire:
        return getattr(importlib.import_module("swactor.wire"), base.name)[value]
    if base.name == "float":
        return float(value)
    return value
