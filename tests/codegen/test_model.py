"""`MODEL` in each generated machine module says what the machine it sits beside does."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from swactor.fsm.generated import MACHINES
from swactor.fsm.model import MachineModel


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"swactor.fsm.generated.{name}")


@pytest.mark.parametrize("name", MACHINES)
def test_model_rows_are_the_rows_the_machine_runs(name: str) -> None:
    module = _module(name)
    model: MachineModel = module.MODEL
    assert model.machine == name == module.MACHINE
    assert model.states == tuple(s.value for s in module.State)
    running: dict[tuple[str, str], list[str | None]] = {}
    ignored: set[tuple[str, str]] = set()
    for (state, event_type), rows in module._TABLE.items():
        pair = (state.value, event_type.__name__)
        if rows is module._IGNORED:
            ignored.add(pair)
        else:
            running[pair] = [None if target is None else target.value for _, target, _ in rows]
    described = {pair: [t.target for t in model.rows(*pair)]
                 for pair in {(t.source, t.event) for t in model.transitions}}
    assert described == running
    assert model.ignored == ignored
    assert model.initial == module.State(model.initial).value
    assert all(t.event in model.events for t in model.transitions)
    assert all(e in model.effects for t in model.transitions for e in t.effects)


@pytest.mark.parametrize("name", MACHINES)
def test_model_guards_follow_the_machine(name: str) -> None:
    module = _module(name)
    for (state, event_type), rows in module._TABLE.items():
        if rows is module._IGNORED:
            continue
        described = module.MODEL.rows(state.value, event_type.__name__)
        guards = [None if g is None else g.__name__.removeprefix("_guard_") for g, _, _ in rows]
        assert [t.guard if t.guard != "else" else None for t in described] == guards
