"""µs per ``handle()``: generated machines against ``transitions`` on the same tables.

Theory of operation
-------------------
For each table in ``fsm/`` (or the names given), a deterministic walk is planned with the
codegen's parsed table: from the initial state, a seeded random choice among the events
that some row handles in the current state, with a random set of guards answering True:
half of the steps move to another live state when one can, most others stay in live
states; one step in twenty (one in four where no other live state is one move away) may
end in a terminal state, where the walk starts a new segment from a fresh machine. The
same walk is then timed on three interpreters, machine construction outside the timed
region:

* the generated ``<Name>Machine.handle(event)`` (effects built, returned);
* a bare ``transitions.Machine`` from the same rows (guards as conditions, no effects):
  the engine cost alone, the conservative baseline;
* ``codegen.reference.ReferenceMachine`` (``transitions`` plus callbacks that build the
  same effects): the like-for-like baseline used by the conformance tests.

Each figure is the best of several repeats, less the cost of the same loop with no
machine in it (setting the guard answers), so it is the cost of one ``handle()`` or one
trigger; ratios are printed beside them. Goal: the generated machine at least 20x faster
per event than bare ``transitions``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from transitions import Machine

from codegen.errors import TableError
from codegen.fieldtypes import FieldType
from codegen.loader import load_table
from codegen.model import Table
from codegen.reference import ReferenceMachine

FSM_DIR = Path(__file__).resolve().parent.parent / "fsm"
GOAL = 20.0
Step = tuple[str, frozenset[str]]


def _value(ftype: FieldType) -> object:
    if ftype.kind == "optional":
        assert ftype.inner is not None
        return _value(ftype.inner)
    if ftype.kind == "tuple":
        return ()
    if ftype.wire:
        wire = importlib.import_module("swactor.wire")
        example = importlib.import_module("swactor.testing.examples").example
        return example(getattr(wire, ftype.name))
    return {"int": 1, "float": 1.5, "str": "x", "bool": True}[ftype.name]


def _events(table: Table, module: ModuleType) -> dict[str, object]:
    return {name: getattr(module, name)(**{f.name: _value(f.type) for f in msg.fields})
            for name, msg in table.events.items()}


def _context(table: Table) -> dict[str, object]:
    return {f.name: _value(f.type) for f in table.context}


class _Guards:
    """Guards answering True for the names in ``true`` (set per step)."""

    true: frozenset[str] = frozenset()


def _guards_class(table: Table) -> type[_Guards]:
    def method(name: str) -> Callable[[_Guards, object], bool]:
        return lambda self, event: name in self.true

    return type("Guards", (_Guards,), {name: method(name) for name in table.guards})


def _next_state(table: Table, state: str, event: str, true: frozenset[str]) -> str:
    for row in table.groups[(state, event)]:
        if row.guard in (None, "else") or row.guard in true:
            return row.target or state
    raise AssertionError("a guarded group ends with else")


def plan_walk(table: Table, length: int, seed: int = 7) -> list[list[Step]]:
    rnd = random.Random(seed)
    segments: list[list[Step]] = [[]]
    state = table.initial
    guards = sorted(table.guards)
    for _ in range(length):
        options = sorted(e for (s, e) in table.groups if s == state)
        true = frozenset(g for g in guards if rnd.random() < 0.5)
        moves = {e: _next_state(table, state, e, true) for e in options}
        alive = [e for e in options if not table.states[moves[e]].terminal]
        onward = [e for e in alive if moves[e] != state]
        roll = rnd.random()
        if onward and roll < 0.5:
            event = rnd.choice(onward)  # explore: a move to another live state
        elif alive and roll < (0.95 if onward else 0.75):
            event = rnd.choice(alive)  # steady state: any live move
        else:
            event = rnd.choice(options)  # finish now and then (a new segment)
        segments[-1].append((event, true))
        state = _next_state(table, state, event, true)
        if table.states[state].terminal:
            segments.append([])
            state = table.initial
    return [s for s in segments if s]


def _bare_transitions(table: Table, guards: _Guards) -> Any:
    model = type("Model", (), {})()
    machine = Machine(model=model, states=list(table.states), initial=table.initial,
                      auto_transitions=False, send_event=True)
    for row in table.rows:
        conditions: list[Any] = []
        if row.guard not in (None, "else"):
            name = row.guard
            conditions = [lambda ed, name=name: getattr(guards, name)(ed.kwargs["event"])]
        machine.add_transition(row.event, row.source, row.target, conditions=conditions)
    return model


def _best_times(runs: list[Callable[[], None]], repeats: int) -> list[float]:
    """Best wall time of each run; the runs take turns so load spikes hit all alike."""
    best = [math.inf] * len(runs)
    for _ in range(repeats):
        for index, run in enumerate(runs):
            start = time.perf_counter()
            run()
            best[index] = min(best[index], time.perf_counter() - start)
    return best


def bench_table(table: Table, length: int, repeats: int) -> tuple[int, float, float, float]:
    module = importlib.import_module(f"swactor.fsm.generated.{table.machine}")
    machine_cls = getattr(module, f"{table.class_prefix}Machine")
    events = _events(table, module)
    context = _context(table)
    segments = [[(events[e], true) for e, true in segment]
                for segment in plan_walk(table, length)]
    guards = _guards_class(table)()
    machines = [[machine_cls(guards, **context) for _ in segments] for _ in range(repeats)]

    def generated() -> None:
        for machine, segment in zip(machines.pop(), segments, strict=True):
            handle = machine.handle
            for event, true in segment:
                guards.true = true
                handle(event)

    bare_models = [[_bare_transitions(table, guards) for _ in segments] for _ in range(repeats)]
    references = [[ReferenceMachine(FSM_DIR / f"{table.machine}.yaml", module, guards, context)
                   for _ in segments] for _ in range(repeats)]

    def bare() -> None:
        for model, segment in zip(bare_models.pop(), segments, strict=True):
            trigger = model.trigger
            for event, true in segment:
                guards.true = true
                trigger(type(event).__name__, event=event)

    def reference() -> None:
        for ref, segment in zip(references.pop(), segments, strict=True):
            handle = ref.handle
            for event, true in segment:
                guards.true = true
                handle(event)

    def harness() -> None:
        for segment in segments:
            for _event, true in segment:
                guards.true = true

    count = sum(len(segment) for segment in segments)
    loop, gen_s, bare_s, ref_s = _best_times([harness, generated, bare, reference], repeats)
    return (count, (gen_s - loop) / count * 1e6, (bare_s - loop) / count * 1e6,
            (ref_s - loop) / count * 1e6)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fsm", description=__doc__)
    parser.add_argument("machines", nargs="*", help="table names (default: every table)")
    parser.add_argument("--events", type=int, default=3000, help="events per walk")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)
    names = args.machines or sorted(p.stem for p in FSM_DIR.glob("*.yaml"))
    print(f"{'machine':<22}{'events':>7}{'generated µs':>14}{'transitions µs':>16}"
          f"{'ratio':>8}{'reference µs':>14}{'ratio':>8}")
    ratios: list[float] = []
    for name in names:
        try:
            table = load_table(FSM_DIR / f"{name}.yaml")
            count, gen_us, bare_us, ref_us = bench_table(table, args.events, args.repeats)
        except (TableError, ImportError, AttributeError) as exc:
            print(f"{name:<22} skipped: {exc}")
            continue
        ratios.append(bare_us / gen_us)
        print(f"{name:<22}{count:>7}{gen_us:>14.2f}{bare_us:>16.2f}{bare_us / gen_us:>7.0f}x"
              f"{ref_us:>14.2f}{ref_us / gen_us:>7.0f}x")
    if not ratios:
        print("no table could be benchmarked")
        return 1
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    verdict = "met" if min(ratios) >= GOAL else "NOT met"
    print(f"speed-up over bare transitions: min {min(ratios):.0f}x, geometric mean {geo:.0f}x "
          f"(goal >= {GOAL:.0f}x: {verdict})")
    return 0
