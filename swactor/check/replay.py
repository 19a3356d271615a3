"""Replay lifecycle events through the generated tables and judge each process's runs.

Theory of operation
-------------------
`Program.build(model, anchors)` turns one table (`MachineModel`) and the anchors of
`swactor.check.lifecycle` into a small automaton over lifecycle events. Each row of the
table becomes a *pattern*: the lifecycle events its binding emits when the row is taken,
in order, each with its count (its event's `on_event` anchors, then its effects'
`on_effect` anchors whose `where` the row's `with:` satisfies). An event that a state
ignores (or a terminal state absorbs) gets a pattern that stays in the state, so an
`on_event` anchor is allowed there too; under the `fault` policy, an unhandled event
leads to the fault state. `in_states` anchors are allowed at rest in their states.

Rows whose pattern can be empty are *silent*: the log cannot show them, so between two
events the machine may have taken any number of them, and guards are unknown. `Tracker`
therefore follows every possibility at once (a nondeterministic automaton): its
configurations are "at rest in state S" or "inside row r, at pattern position p, having
seen the event there k times". Feeding an event keeps the configurations that can
consume it after any silent steps; none left is a violation: the tables allow no path
that emits these events in this order. The states reported after each event are those
of the rows (or rests) that consumed it. A replay is *complete* when a terminal state
can be reached without another event.

`check(events)` groups events by process (`proc`, `pid`) and run (`run_id`; events
without one form the process's own group), orders each group by the process's monotonic
clock (`mono`: emission order), picks the group's `Role` (the first whose machines
anchor all its events) and feeds each event to the instance of each of those machines
that it names (`lifecycle.KEYS`). Every group gets a `GroupReport` with a one-line
verdict; the first violation in a group ends its replay.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from swactor.check.lifecycle import ANCHORS, KEYS, ROLES, UNCHECKED, Anchor, Count, Role
from swactor.events.names import EventName
from swactor.events.schema import Emitted
from swactor.fsm.model import MachineModel


class MappingError(ValueError):
    """An anchor names a state, event, effect or field its table does not have."""


@dataclass(frozen=True, slots=True)
class Symbol:
    """One position of a row's pattern: a lifecycle event and its count."""

    name: str
    least: int
    most: int | None


@dataclass(frozen=True, slots=True)
class Path:
    """A row (or an ignore) as the automaton sees it."""

    source: str
    target: str
    pattern: tuple[Symbol, ...]
    label: str


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    """One table compiled against its anchors (module doc)."""

    model: MachineModel
    paths: Mapping[str, tuple[Path, ...]]
    """Source state -> the paths out of it."""
    resting: Mapping[str, frozenset[str]]
    """Lifecycle event -> the states it may be emitted in without a transition."""
    names: frozenset[str]

    @staticmethod
    def build(model: MachineModel, anchors: Iterable[Anchor]) -> Program:
        mine = [a for a in anchors if a.machine == model.machine]
        _validate(model, mine)
        on_event: dict[str, list[Symbol]] = {}
        on_effect: dict[str, list[tuple[Anchor, Symbol]]] = {}
        resting: dict[str, set[str]] = {}
        for anchor in mine:
            symbol = Symbol(anchor.event.value, anchor.count.least, anchor.count.most)
            for event in anchor.on_event:
                on_event.setdefault(event, []).append(symbol)
            if anchor.on_effect is not None:
                on_effect.setdefault(anchor.on_effect, []).append((anchor, symbol))
            if anchor.in_states:
                resting.setdefault(symbol.name, set()).update(anchor.in_states)
        paths: dict[str, list[Path]] = {state: [] for state in model.states}
        for row in model.transitions:
            pattern = list(on_event.get(row.event, ()))
            for effect in row.effects:
                for anchor, symbol in on_effect.get(effect, ()):
                    if anchor.where is None or row.literal(effect, anchor.where[0]) == (
                            True, anchor.where[1]):
                        pattern.append(symbol)
            guard = f" [{row.guard}]" if row.guard else ""
            paths[row.source].append(Path(row.source, row.next_state, tuple(pattern),
                                          f"{row.event}{guard}"))
        handled = {(t.source, t.event) for t in model.transitions}
        for event, symbols in on_event.items():
            for state in model.states:
                if (state, event) in handled:
                    continue
                if (state in model.terminal or (state, event) in model.ignored
                        or model.unhandled == "ignore"):
                    target = state
                elif model.unhandled == "fault" and model.fault_state is not None:
                    target = model.fault_state
                else:
                    continue  # "raise": the binding may not feed it here
                paths[state].append(Path(state, target, tuple(symbols), f"{event} (ignored)"))
        return Program(model, {s: tuple(p) for s, p in paths.items()},
                       {k: frozenset(v) for k, v in resting.items()},
                       frozenset(a.event.value for a in mine))


def _validate(model: MachineModel, anchors: list[Anchor]) -> None:
    where = model.machine
    for anchor in anchors:
        for event in anchor.on_event:
            if event not in model.events:
                raise MappingError(f"{where}: no event {event} ({anchor.event.value})")
        for state in anchor.in_states:
            if state not in model.states:
                raise MappingError(f"{where}: no state {state} ({anchor.event.value})")
        if anchor.on_effect is not None:
            rows = [t for t in model.transitions if anchor.on_effect in t.effects]
            if anchor.on_effect not in model.effects or not rows:
                raise MappingError(f"{where}: no row does {anchor.on_effect} "
                                   f"({anchor.event.value})")
            if anchor.where is not None and not any(
                    t.literal(anchor.on_effect, anchor.where[0])[0] for t in rows):
                raise MappingError(f"{where}: no row sets {anchor.on_effect}."
                                   f"{anchor.where[0]} ({anchor.event.value})")
        if not (anchor.on_event or anchor.on_effect or anchor.in_states):
            raise MappingError(f"{where}: {anchor.event.value} is anchored nowhere")


# A configuration: ("rest", state) or ("row", path, position, times seen there).
Config = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Violation:
    """The first event the table does not allow, where, and what it would have allowed."""

    index: int
    """Position of the event in its group (0-based)."""
    event: str
    mono: int
    states: tuple[str, ...]
    """The states the machine could be in just before it."""
    expected: tuple[str, ...]
    """The lifecycle events the table would have allowed there."""


_CLOSURES: dict[Program, dict[frozenset[Config], dict[Config, int]]] = {}
"""Per compiled table (by identity): closures already computed."""
_CLOSURES_KEPT = 4096


class Tracker:
    """One machine instance being replayed (module doc)."""

    def __init__(self, program: Program, key: tuple[int, ...]) -> None:
        self.program = program
        self.key = key
        self.configs: dict[Config, int] = self._closure({("rest", program.model.initial)})
        self.seen: list[str] = [program.model.initial]
        self.events = 0
        self.violation: Violation | None = None

    @property
    def machine(self) -> str:
        return self.program.model.machine

    def _closure(self, configs: Iterable[Config]) -> dict[Config, int]:
        """Every configuration reachable without an event, with the fewest silent rows
        taken to reach it (breadth first); memoised per table, since a run repeats the
        same few situations (one per token)."""
        start = frozenset(configs)
        cache = _CLOSURES.setdefault(self.program, {})
        found = cache.get(start)
        if found is None:
            if len(cache) > _CLOSURES_KEPT:
                cache.clear()
            found = cache[start] = self._reach(start)
        return found

    def _reach(self, configs: Iterable[Config]) -> dict[Config, int]:
        out: dict[Config, int] = {}
        layer = list(configs)
        depth = 0
        while layer:
            following: list[Config] = []
            todo = layer
            while todo:
                config = todo.pop()
                if config in out:
                    continue
                out[config] = depth
                if config[0] == "rest":
                    todo += [("row", path, 0, 0) for path in self.program.paths[config[1]]]
                    continue
                _, path, pos, seen = config
                if pos == len(path.pattern):
                    following.append(("rest", path.target))
                elif seen >= path.pattern[pos].least:
                    todo.append(("row", path, pos + 1, 0))
            layer = following
            depth += 1
        return out

    def _consume(self, config: Config, name: str) -> Config | None:
        if config[0] == "rest":
            return config if config[1] in self.program.resting.get(name, ()) else None
        _, path, pos, seen = config
        if pos < len(path.pattern):
            symbol = path.pattern[pos]
            if symbol.name == name and (symbol.most is None or seen < symbol.most):
                return ("row", path, pos, 1)
        return None

    @staticmethod
    def _state(config: Config) -> str:
        return str(config[1]) if config[0] == "rest" else str(config[1].target)

    def states(self) -> tuple[str, ...]:
        """Where the last event left the machine (before any unseen row)."""
        here = {self._state(c) for c, depth in self.configs.items()
                if depth == 0 and (c[0] == "rest" or c[2] or c[3])}
        return tuple(sorted(here or {self._state(c) for c in self.configs}))

    def expected(self) -> tuple[str, ...]:
        names: set[str] = set()
        for config in self.configs:
            if config[0] == "rest":
                names |= {n for n, states in self.program.resting.items() if config[1] in states}
            else:
                _, path, pos, seen = config
                if pos < len(path.pattern):
                    symbol = path.pattern[pos]
                    if symbol.most is None or seen < symbol.most:
                        names.add(symbol.name)
        return tuple(sorted(names))

    def feed(self, name: str, index: int, mono: int) -> bool:
        """Consume one event; False (and `violation` set) when no path allows it."""
        if self.violation is not None:
            return False
        consumed: dict[Config, int] = {}
        for config, depth in self.configs.items():
            after = self._consume(config, name)
            if after is not None and depth < consumed.get(after, depth + 1):
                consumed[after] = depth
        if not consumed:
            self.violation = Violation(index, name, mono, self.states(), self.expected())
            return False
        self.events += 1
        fewest = min(consumed.values())  # the likeliest: fewest unseen rows before it
        now = "|".join(sorted({self._state(c) for c, d in consumed.items() if d == fewest}))
        if now != self.seen[-1]:
            self.seen.append(now)
        self.configs = self._closure(consumed)
        return True

    @property
    def complete(self) -> bool:
        """Whether a terminal state is reachable without another event."""
        terminal = self.program.model.terminal
        return any(c[0] == "rest" and c[1] in terminal for c in self.configs)

    def describe(self) -> str:
        key = ",".join(str(k) for k in self.key)
        return f"{self.machine}[{key}]"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "machine": self.machine, "key": list(self.key), "events": self.events,
            "states": self.seen, "complete": self.complete,
        }
        if self.violation is not None:
            v = self.violation
            out["violation"] = {"index": v.index, "event": v.event, "mono": v.mono,
                                "states": list(v.states), "expected": list(v.expected)}
        return out


@cache
def program(machine: str) -> Program:
    """The compiled program of one generated table (cached)."""
    module = importlib.import_module(f"swactor.fsm.generated.{machine}")
    return Program.build(module.MODEL, ANCHORS)


@dataclass
class GroupReport:
    """One process's events for one run (or for itself), replayed."""

    proc: str
    pid: int
    run_id: int | None
    role: str | None
    events: int
    unchecked: int = 0
    trackers: list[Tracker] = field(default_factory=list)
    stray: tuple[int, str] | None = None
    """(index, event) of an event no machine of the role anchors (a violation too)."""

    @property
    def violation(self) -> tuple[Tracker | None, int, str] | None:
        found = [(t.violation.index, t) for t in self.trackers if t.violation is not None]
        first = min(found, key=lambda item: item[0], default=None)
        if self.stray is not None and (first is None or self.stray[0] < first[0]):
            return None, self.stray[0], self.stray[1]
        if first is None:
            return None
        tracker = first[1]
        assert tracker.violation is not None
        return tracker, tracker.violation.index, tracker.violation.event

    @property
    def complete(self) -> bool:
        return all(t.complete for t in self.trackers)

    @property
    def verdict(self) -> str:
        if self.violation is not None:
            return "violation"
        return "ok" if self.complete else "incomplete"

    @property
    def where(self) -> str:
        run = f" run {self.run_id}" if self.run_id is not None else ""
        return f"{self.proc}[{self.pid}]{run}"

    def line(self) -> str:
        """The one-line verdict."""
        found = self.violation
        if found is not None:
            tracker, index, event = found
            if tracker is None:
                return (f"VIOLATION {self.where}: event {index + 1} {event} belongs to no "
                        f"table of its role ({self.role or 'none'})")
            v = tracker.violation
            assert v is not None
            expected = ", ".join(v.expected) or "nothing"
            return (f"VIOLATION {self.where}: {tracker.describe()}: event {index + 1} {event} "
                    f"not allowed in {'|'.join(v.states)} (allowed: {expected}); "
                    f"states seen: {_path(tracker.seen)}")
        if not self.trackers:
            return f"ok {self.where}: {self.events} events, none replayed ({self.unchecked} " \
                   "unchecked)"
        parts = [f"{t.describe()} {_path(t.seen)}" for t in self.trackers]
        head = "ok" if self.complete else "INCOMPLETE"
        return f"{head} {self.where} ({self.role}, {self.events} events): {'; '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        found = self.violation
        out: dict[str, Any] = {
            "proc": self.proc, "pid": self.pid, "run_id": self.run_id, "role": self.role,
            "verdict": self.verdict, "line": self.line(), "events": self.events,
            "unchecked": self.unchecked, "machines": [t.to_json() for t in self.trackers],
        }
        if found is not None:
            out["first_violation"] = {"index": found[1], "event": found[2]}
        return out


def _path(states: list[str], head: int = 5, tail: int = 3) -> str:
    """States seen, joined; a long path keeps its start and end."""
    if len(states) <= head + tail + 1:
        return " -> ".join(states)
    hidden = len(states) - head - tail
    return " -> ".join([*states[:head], f"({hidden} more)", *states[-tail:]])


def _role_for(names: set[str], per_run: bool) -> Role | None:
    roles = [r for r in ROLES if r.per_run == per_run]
    anchored = {r.name: {a.event.value for a in ANCHORS if a.machine in r.machines}
                for r in roles}
    for role in roles:
        if names <= anchored[role.name]:
            return role
    return max(roles, key=lambda r: len(names & anchored[r.name]), default=None)


def check_group(proc: str, pid: int, run_id: int | None, events: list[Emitted]
                ) -> GroupReport:
    """Replay one process's events for one run (in `mono` order) through its role's tables."""
    ordered = sorted(events, key=lambda e: e.mono)  # stable: ties keep their input order
    report = GroupReport(proc, pid, run_id, None, len(ordered))
    checked = [e for e in ordered if e.name not in UNCHECKED]
    report.unchecked = len(ordered) - len(checked)
    if not checked:
        return report
    role = _role_for({e.name.value for e in checked}, per_run=run_id is not None)
    report.role = role.name if role is not None else None
    trackers: dict[tuple[str, tuple[int, ...]], Tracker] = {}
    for index, emitted in enumerate(ordered):
        name = emitted.name
        if name in UNCHECKED:
            continue
        machines = [] if role is None else [
            m for m in role.machines if name in _anchored(m)]
        if not machines:
            report.stray = (index, name.value)
            break
        stop = False
        for machine in machines:
            key = tuple(int(emitted.value(k) or 0) for k in KEYS[machine])
            tracker = trackers.get((machine, key))
            if tracker is None:
                tracker = trackers[(machine, key)] = Tracker(program(machine), key)
                report.trackers.append(tracker)
            stop |= not tracker.feed(name.value, index, emitted.mono)
        if stop:
            break
    return report


@cache
def _anchored(machine: str) -> frozenset[EventName]:
    return frozenset(a.event for a in ANCHORS if a.machine == machine)


def check(events: Iterable[Emitted]) -> list[GroupReport]:
    """Group `events` by process and run, replay each group (module doc)."""
    groups: dict[tuple[str, int, int | None], list[Emitted]] = {}
    for emitted in events:
        run = emitted.value("run_id")
        groups.setdefault((emitted.proc, emitted.pid, run), []).append(emitted)
    reports = [check_group(proc, pid, run, found)
               for (proc, pid, run), found in groups.items()]
    first = {key: min(e.mono for e in found) for key, found in groups.items()}
    keys = list(groups)
    order = sorted(range(len(keys)), key=lambda i: (first[keys[i]], i))
    return [reports[i] for i in order]


def verdict(reports: list[GroupReport]) -> str:
    """"violation" if any group has one, else "incomplete" if any is, else "ok"."""
    found = {r.verdict for r in reports}
    for level in ("violation", "incomplete"):
        if level in found:
            return level
    return "ok"


__all__ = ["Count", "GroupReport", "MappingError", "Program", "Tracker", "check",
           "check_group", "program", "verdict"]
