"""Load one ``fsm/*.yaml`` table into a validated ``codegen.model.Table``.

Theory of operation
-------------------
``load_table(path)`` runs three passes and stops at the first problem with a
``TableError`` (``file:line: rule: message``):

1. *Declarations* (``_Reader``): the top-level keys, context, states, events, effects
   and guards are read with their YAML lines; names, docs and field types are checked
   (types against ``swactor.wire`` through ``WireNames``).
2. *Rows*: each transition row is checked against the declarations (states, events,
   effects, guards, ``with:`` literals, ``assign:``, a source for every effect field)
   and expanded: a list ``from`` gives one row per state; ``"*"`` gives one row per
   non-terminal state that neither has an explicit row for the event nor ignores it.
   Rows for the same ``(state, event)`` form a group, tried in YAML order; a group of
   more than one row must be named guards closed by exactly one final ``else``.
3. *Graph* (``codegen.graph``): reachability from the initial state and a path from
   every non-terminal state to a terminal one, counting the implicit edge of the
   ``unhandled: fault`` policy.
"""

from __future__ import annotations

import hashlib
import keyword
import re
from pathlib import Path
from typing import Any, NoReturn

from codegen.errors import TableError
from codegen.fieldtypes import FieldType, WireNames, parse_type
from codegen.graph import check_graph
from codegen.model import (
    VIOLATION_METHOD,
    Field,
    Guard,
    Message,
    Policy,
    Row,
    Scalar,
    State,
    Table,
    Timer,
    effect_method,
)
from codegen.yamlmarks import MarkedDict, MarkedList, load_marked

_MACHINE = re.compile(r"[a-z][a-z0-9_]*\Z")
_CAMEL = re.compile(r"[A-Z][A-Za-z0-9]*\Z")
_SNAKE = re.compile(r"[a-z][a-z0-9_]*\Z")
_RESERVED_CLASSES = frozenset(
    {"State", "Event", "Effect", "StartTimer", "CancelTimer", "ProtocolViolation",
     "ProtocolError", "MACHINE", "SPEC", "TIMER_EVENTS", "EFFECT_METHODS", "Result", "R",
     "Any", "Callable", "Final", "Protocol", "TypeAlias", "Never"}
)
_RESERVED_CONTEXT = frozenset({"state", "handle", "guards"})
_TOP_KEYS = frozenset({"machine", "spec", "doc", "unhandled", "fault_state", "ignore",
                       "context", "states", "events", "effects", "guards", "transitions"})
_ROW_KEYS = frozenset({"from", "event", "to", "guard", "effects", "with", "assign",
                       "fault", "doc"})
_STATE_KEYS = frozenset({"doc", "initial", "terminal", "fault", "timer", "ignore"})


def load_table(path: Path, wire: WireNames | None = None) -> Table:
    """Parse and validate one table file."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:  # found by tests/faults/test_fuzz.py
        raise TableError(path, 1, "yaml", f"not UTF-8: {error.reason} at byte {error.start}") \
            from None
    raw = load_marked(text, path)
    reader = _Reader(path, wire or WireNames())
    table = reader.declarations(raw, hashlib.sha256(data).hexdigest())
    reader.rows(table, raw)
    check_graph(table)
    return table


class _Reader:
    def __init__(self, path: Path, wire: WireNames) -> None:
        self.path = path
        self.wire = wire

    def fail(self, line: int, rule: str, message: str) -> NoReturn:
        raise TableError(self.path, line, rule, message)

    # -- shape helpers -------------------------------------------------------------

    def mapping(self, value: Any, line: int, what: str) -> MarkedDict:
        if not isinstance(value, MarkedDict):
            self.fail(line, "schema", f"{what} must be a mapping")
        return value

    def keys(self, value: MarkedDict, allowed: frozenset[str], what: str) -> None:
        for key in value:
            if key not in allowed:
                self.fail(value.key_lines[key], "schema",
                          f"unknown key {key!r} in {what} (allowed: {', '.join(sorted(allowed))})")

    def text(self, value: MarkedDict, key: str, what: str, *, rule: str = "schema",
             owner_line: int | None = None) -> str:
        """A non-empty string at ``key``; a missing one is reported at ``owner_line``."""
        found = value.get(key)
        if found is None:
            self.fail(owner_line or value.line, rule, f"{what} has no `{key}:`")
        if not isinstance(found, str) or not found.strip():
            self.fail(value.key_lines[key], rule, f"`{key}:` of {what} must be a non-empty string")
        return found.strip()

    def flag(self, value: MarkedDict, key: str, what: str) -> bool:
        found = value.get(key, False)
        if not isinstance(found, bool):
            self.fail(value.key_lines[key], "schema", f"`{key}:` of {what} must be true or false")
        return found

    def names(self, value: Any, line: int, what: str) -> list[tuple[str, int]]:
        if value is None:
            return []
        if not isinstance(value, MarkedList) or not all(isinstance(v, str) for v in value):
            self.fail(line, "schema", f"{what} must be a list of names")
        return list(zip(value, value.item_lines, strict=True))

    def identifier(self, name: Any, line: int, pattern: re.Pattern[str], what: str) -> str:
        if not isinstance(name, str) or not pattern.match(name) or keyword.iskeyword(name):
            self.fail(line, "name", f"{what} {name!r} must match {pattern.pattern[:-2]}")
        return name

    # -- pass 1: declarations -----------------------------------------------------

    def effect_methods(self, effects: dict[str, Message], guards: dict[str, Guard],
                       policy: Policy) -> None:
        """Each effect's port method (``effect_method``) is one distinct name that is no
        guard's: one binding class implements both protocols."""
        taken: dict[str, str] = {name: f"guard {name}" for name in guards}
        if policy == "fault":
            taken[VIOLATION_METHOD] = "the built-in ProtocolViolation"
        for name, effect in effects.items():
            method = effect_method(name)
            if method in taken or keyword.iskeyword(method):
                self.fail(effect.line, "name", f"effect {name!r}: its port method {method!r} "
                          f"is taken by {taken.get(method, 'a keyword')}")
            taken[method] = f"effect {name}"

    def declarations(self, raw: Any, sha256: str) -> Table:
        top = self.mapping(raw, 1, "a table")
        self.keys(top, _TOP_KEYS, "the table")
        for key in ("machine", "spec", "states", "events", "transitions", "unhandled"):
            if key not in top:
                self.fail(1, "schema", f"the table has no `{key}:`")
        machine = self.identifier(top["machine"], top.key_lines["machine"], _MACHINE, "machine")
        if machine != self.path.stem:
            self.fail(top.key_lines["machine"], "name",
                      f"machine {machine!r} must equal the file name {self.path.stem!r}")
        spec = self.text(top, "spec", "the table")
        if any(char in spec for char in '"\\\n'):
            self.fail(top.key_lines["spec"], "schema",
                      "`spec:` is one line of section numbers, without quotes or backslashes")
        doc = self.text(top, "doc", "the table", rule="missing-doc")
        unhandled = top["unhandled"]
        if unhandled not in ("raise", "ignore", "fault"):
            self.fail(top.key_lines["unhandled"], "schema",
                      f"unhandled must be raise, ignore or fault, not {unhandled!r}")
        policy: Policy = unhandled
        prefix = "".join(part.capitalize() for part in machine.split("_"))
        reserved = _RESERVED_CLASSES | {
            f"{prefix}Machine", f"{prefix}Guards", f"{prefix}Effects"}

        context = self.fields(top.get("context"), top.key_lines.get("context", 1), "context")
        for item in context:
            if item.name in _RESERVED_CONTEXT:
                self.fail(item.line, "name", f"context field {item.name!r} is a reserved name")
        events = self.messages(top["events"], top.key_lines["events"], "event", reserved)
        effects = self.messages(top.get("effects"), top.key_lines.get("effects", 1), "effect",
                                reserved)
        for name, effect in effects.items():
            if name in events:
                self.fail(effect.line, "name", f"effect {name!r} has the name of an event")
        guards: dict[str, Guard] = {}
        guards_raw = top.get("guards")
        if guards_raw is not None:
            for name, body in self.mapping(guards_raw, top.key_lines["guards"], "guards").items():
                line = guards_raw.key_lines[name]
                self.identifier(name, line, _SNAKE, "guard")
                if name == "else":
                    self.fail(line, "name", "`else` is not a guard name")
                body = self.mapping(body, line, f"guard {name}")
                self.keys(body, frozenset({"doc"}), f"guard {name}")
                guards[name] = Guard(name, self.text(body, "doc", f"guard {name}",
                                                     rule="missing-doc", owner_line=line), line)

        self.effect_methods(effects, guards, policy)
        table = Table(machine=machine, spec=spec, doc=doc, path=str(self.path), sha256=sha256,
                      unhandled=policy, fault_state=None, ignore=(), context=context,
                      states={}, events=events, effects=effects, guards=guards)
        table.ignore = tuple(self.known_events(top.get("ignore"),
                                               top.key_lines.get("ignore", 1), table, "ignore"))
        table.states = self.states(top["states"], top.key_lines["states"], table)
        fault_state = top.get("fault_state")
        fault_line = top.key_lines.get("fault_state", 1)
        if policy == "fault":
            if fault_state is None:
                self.fail(top.key_lines["unhandled"], "fault-state",
                          "unhandled: fault needs a `fault_state:`")
            if not isinstance(fault_state, str) or fault_state not in table.states:
                self.fail(fault_line, "fault-state", f"fault_state {fault_state!r} is not a state")
            table.fault_state = fault_state
        elif fault_state is not None:
            self.fail(fault_line, "fault-state",
                      f"fault_state given but unhandled is {policy!r}, not fault")
        return table

    def fields(self, raw: Any, line: int, owner: str) -> tuple[Field, ...]:
        if raw is None:
            return ()
        fields = self.mapping(raw, line, f"fields of {owner}")
        out: list[Field] = []
        for name, body in fields.items():
            field_line = fields.key_lines[name]
            self.identifier(name, field_line, _SNAKE, f"field of {owner}")
            body = self.mapping(body, field_line, f"field {owner}.{name}")
            self.keys(body, frozenset({"type", "doc"}), f"field {owner}.{name}")
            type_text = self.text(body, "type", f"field {owner}.{name}", owner_line=field_line)
            doc = self.text(body, "doc", f"field {owner}.{name}", rule="missing-doc",
                            owner_line=field_line)
            out.append(Field(name, self.field_type(type_text, body.key_lines["type"]), doc,
                             field_line))
        return tuple(out)

    def field_type(self, text: str, line: int) -> FieldType:
        try:
            parsed = parse_type(text)
        except ValueError as exc:
            self.fail(line, "unknown-type", str(exc))
        for name in sorted(parsed.names()):
            if not self.wire.exports(name):
                self.fail(line, "unknown-type",
                          f"type {name!r} is neither a builtin nor exported by swactor.wire")
        return parsed

    def messages(self, raw: Any, line: int, kind: str,
                 reserved: frozenset[str]) -> dict[str, Message]:
        if raw is None:
            return {}
        body_map = self.mapping(raw, line, f"{kind}s")
        out: dict[str, Message] = {}
        for name, body in body_map.items():
            msg_line = body_map.key_lines[name]
            self.identifier(name, msg_line, _CAMEL, kind)
            if name in reserved:
                self.fail(msg_line, "name", f"{kind} {name!r} clashes with a generated name")
            body = self.mapping(body, msg_line, f"{kind} {name}")
            self.keys(body, frozenset({"doc", "fields", "wire"}), f"{kind} {name}")
            doc = self.text(body, "doc", f"{kind} {name}", rule="missing-doc",
                            owner_line=msg_line)
            if body.get("wire", False) is not False:
                out[name] = self.wire_message(name, doc, msg_line, body, kind)
                continue
            fields = self.fields(body.get("fields"), body.key_lines.get("fields", msg_line),
                                 name)
            out[name] = Message(name, doc, msg_line, fields)
        return out

    def wire_message(self, name: str, doc: str, line: int, body: MarkedDict,
                     kind: str) -> Message:
        """A ``wire: true`` event or effect: the class ``swactor.wire.<name>`` itself,
        its fields read from the dataclass (a table does not repeat them)."""
        wire_line = body.key_lines["wire"]
        if body["wire"] is not True:
            self.fail(wire_line, "schema", f"{kind} {name}: `wire:` is `true` or absent")
        if "fields" in body:
            self.fail(body.key_lines["fields"], "schema",
                      f"{kind} {name} is the wire class: its fields come from swactor.wire")
        found = self.wire.message_fields(name)
        if found is None:
            self.fail(wire_line, "unknown-type",
                      f"{kind} {name}: swactor.wire exports no dataclass {name!r}")
        fields = tuple(
            Field(field_name, self.field_type(annotation, wire_line),
                  f"See swactor.wire.{name}.", wire_line)
            for field_name, annotation in found
        )
        return Message(name, doc, line, fields, wire=True)

    def known_events(self, raw: Any, line: int, table: Table, what: str) -> list[str]:
        found = []
        for name, item_line in self.names(raw, line, what):
            if name not in table.events:
                self.fail(item_line, "unknown-name", f"{what}: unknown event {name!r}")
            found.append(name)
        return found

    def states(self, raw: Any, line: int, table: Table) -> dict[str, State]:
        body_map = self.mapping(raw, line, "states")
        out: dict[str, State] = {}
        for name, body in body_map.items():
            state_line = body_map.key_lines[name]
            self.identifier(name, state_line, _CAMEL, "state")
            body = self.mapping(body, state_line, f"state {name}")
            self.keys(body, _STATE_KEYS, f"state {name}")
            out[name] = State(
                name=name,
                doc=self.text(body, "doc", f"state {name}", rule="missing-doc",
                              owner_line=state_line),
                line=state_line,
                initial=self.flag(body, "initial", f"state {name}"),
                terminal=self.flag(body, "terminal", f"state {name}"),
                fault=self.flag(body, "fault", f"state {name}"),
                timer=self.timer(body, name, table),
                ignore=tuple(self.known_events(body.get("ignore"),
                                               body.key_lines.get("ignore", state_line), table,
                                               f"ignore of state {name}")),
            )
        initials = [s for s in out.values() if s.initial]
        if len(initials) != 1:
            where = initials[1].line if len(initials) > 1 else line
            self.fail(where, "initial",
                      f"exactly one state must be initial, found {len(initials)}"
                      + (f" ({', '.join(s.name for s in initials)})" if initials else ""))
        for state in out.values():
            if state.timer is not None and (state.initial or state.terminal):
                self.fail(state.timer.line, "timer",
                          f"state {state.name} is {'initial' if state.initial else 'terminal'}"
                          " and cannot have a timer (no row would arm or cancel it)")
        return out

    def timer(self, body: MarkedDict, state: str, table: Table) -> Timer | None:
        raw = body.get("timer")
        if raw is None:
            return None
        line = body.key_lines["timer"]
        timer = self.mapping(raw, line, f"timer of {state}")
        self.keys(timer, frozenset({"event", "after"}), f"timer of {state}")
        event = self.text(timer, "event", f"timer of {state}")
        if event not in table.events:
            self.fail(timer.key_lines["event"], "unknown-name", f"timer event {event!r} unknown")
        if table.events[event].fields:
            self.fail(timer.key_lines["event"], "timer",
                      f"timer event {event!r} must have no fields")
        after = timer.get("after")
        after_line = timer.key_lines.get("after", line)
        if isinstance(after, bool) or after is None:
            self.fail(after_line, "timer", f"timer of {state} needs `after:` seconds")
        if isinstance(after, int | float):
            if after <= 0:
                self.fail(after_line, "timer", f"timer of {state}: after must be > 0")
            return Timer(event, float(after), line)
        ctx = table.context_field(str(after))
        if ctx is None:
            self.fail(after_line, "unknown-name", f"timer after: unknown context field {after!r}")
        if not FieldType("name", "float").accepts(ctx.type):
            self.fail(after_line, "timer", f"timer after: context field {after!r} is {ctx.type}, "
                      "not float seconds")
        return Timer(event, str(after), line)

    # -- pass 2: rows -------------------------------------------------------------

    def rows(self, table: Table, top: MarkedDict) -> None:
        raw_rows = top["transitions"]
        if not isinstance(raw_rows, MarkedList):
            self.fail(top.key_lines["transitions"], "schema", "transitions must be a list")
        explicit: dict[tuple[str, str], list[Row]] = {}
        wildcard: list[Row] = []
        for index, (raw, line) in enumerate(zip(raw_rows, raw_rows.item_lines, strict=True)):
            row_map = self.mapping(raw, line, "a transition row")
            self.keys(row_map, _ROW_KEYS, "a transition row")
            for source, row in self.row(table, row_map, index):
                if source == "*":
                    wildcard.append(row)
                else:
                    explicit.setdefault((row.source, row.event), []).append(row)
        groups: dict[tuple[str, str], list[Row]] = dict(explicit)
        for (state_name, event), rows in explicit.items():
            if event in table.states[state_name].ignore:
                self.fail(rows[0].line, "duplicate-row",
                          f"state {state_name} both handles and ignores {event}")
        for row in wildcard:
            for state in table.states.values():
                key = (state.name, row.event)
                if state.terminal or key in explicit or row.event in state.ignore:
                    continue
                groups.setdefault(key, []).append(_with_source(row, state.name))
        for rows in groups.values():
            self.check_group(rows)
        table.groups = groups
        table.rows = sorted((r for rows in groups.values() for r in rows),
                            key=lambda r: (r.index, list(table.states).index(r.source)))

    def row(self, table: Table, raw: MarkedDict, index: int) -> list[tuple[str, Row]]:
        line = raw.line
        if "from" not in raw or "event" not in raw:
            self.fail(line, "schema", "a transition row needs `from:` and `event:`")
        for key in ("event", "to", "guard"):
            if key in raw and not isinstance(raw[key], str):
                self.fail(raw.key_lines[key], "schema", f"`{key}:` must be a name")
        event = raw["event"]
        if event not in table.events:
            self.fail(raw.key_lines["event"], "unknown-name", f"unknown event {event!r}")
        sources: list[tuple[str, int]]
        if raw["from"] == "*":
            sources = [("*", raw.key_lines["from"])]
        elif isinstance(raw["from"], str):
            sources = [(raw["from"], raw.key_lines["from"])]
        else:
            sources = self.names(raw["from"], raw.key_lines["from"], "from")
        if not sources:
            self.fail(raw.key_lines["from"], "schema", "`from:` names no state")
        for source, source_line in sources:
            if source == "*":
                continue
            if source not in table.states:
                self.fail(source_line, "unknown-name", f"unknown state {source!r} in from")
            if table.states[source].terminal:
                self.fail(source_line, "terminal-row",
                          f"row out of terminal state {source} (terminal states absorb)")
        target = raw.get("to")
        if target is not None and target not in table.states:
            self.fail(raw.key_lines["to"], "unknown-name", f"unknown state {target!r} in to")
        guard = raw.get("guard")
        if guard is not None and guard != "else" and guard not in table.guards:
            self.fail(raw.key_lines["guard"], "unknown-name", f"unknown guard {guard!r}")
        effect_items = self.names(raw.get("effects"), raw.key_lines.get("effects", line),
                                  "effects")
        for name, effect_line in effect_items:
            if name not in table.effects:
                self.fail(effect_line, "unknown-name", f"unknown effect {name!r}")
        effects = [name for name, _ in effect_items]
        with_values = self.with_values(table, raw, effects)
        assign = self.assign(table, raw, event)
        fault = raw.get("fault", False)
        if not isinstance(fault, bool):
            self.fail(raw.key_lines["fault"], "schema", "fault must be true or false")
        doc = raw.get("doc", "")
        if not isinstance(doc, str):
            self.fail(raw.key_lines["doc"], "schema", "doc must be a string")
        assigned = {ctx for ctx, _ in assign}
        for name in effects:
            self.check_sources(table, table.effects[name], event, with_values, assigned, line)
        row = Row(source="*", event=event, guard=guard, target=target, effects=tuple(effects),
                  with_values=with_values, assign=assign, fault=fault, doc=doc.strip(),
                  line=line, wildcard=sources[0][0] == "*", index=index)
        return [(source, _with_source(row, source)) for source, _ in sources]

    def with_values(self, table: Table, raw: MarkedDict,
                    effects: list[str]) -> tuple[tuple[str, str, Scalar], ...]:
        if "with" not in raw:
            return ()
        body = self.mapping(raw["with"], raw.key_lines["with"], "with")
        out: list[tuple[str, str, Scalar]] = []
        for key, value in body.items():
            line = body.key_lines[key]
            effect_name, _, field_name = str(key).partition(".")
            if effect_name not in effects:
                self.fail(line, "unknown-name", f"with: {key!r} names no effect of this row")
            target = table.effects[effect_name].field(field_name)
            if target is None:
                self.fail(line, "unknown-name", f"with: effect {effect_name} has no field "
                          f"{field_name!r}")
            problem = self.literal_problem(target.type, value)
            if problem:
                self.fail(line, "type-mismatch", f"with: {key}: {problem}")
            out.append((effect_name, field_name, value))
        return tuple(out)

    def literal_problem(self, ftype: FieldType, value: Any) -> str:
        if ftype.kind == "optional":
            assert ftype.inner is not None
            return "" if value is None else self.literal_problem(ftype.inner, value)
        if ftype.kind == "tuple":
            return f"no literal fits a {ftype} field"
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
        }.get(ftype.name)
        if ok is not None:
            return "" if ok else f"{value!r} is not of type {ftype.name}"
        members = self.wire.enum_members(ftype.name)
        if members is None:
            return f"no literal fits a {ftype.name} field (only builtins and enums)"
        if value not in members:
            return f"{value!r} is not a member of {ftype.name} ({', '.join(sorted(members))})"
        return ""

    def assign(self, table: Table, raw: MarkedDict, event: str) -> tuple[tuple[str, str], ...]:
        if "assign" not in raw:
            return ()
        body = self.mapping(raw["assign"], raw.key_lines["assign"], "assign")
        out: list[tuple[str, str]] = []
        for ctx_name, event_field in body.items():
            line = body.key_lines[ctx_name]
            ctx = table.context_field(str(ctx_name))
            if ctx is None:
                self.fail(line, "unknown-name", f"assign: unknown context field {ctx_name!r}")
            source = table.events[event].field(str(event_field))
            if source is None:
                self.fail(line, "unknown-name", f"assign: event {event} has no field "
                          f"{event_field!r}")
            if not ctx.type.accepts(source.type):
                self.fail(line, "type-mismatch", f"assign: {ctx_name} is {ctx.type}, "
                          f"{event}.{event_field} is {source.type}")
            out.append((ctx.name, source.name))
        return tuple(out)

    def check_sources(self, table: Table, effect: Message, event: str,
                      with_values: tuple[tuple[str, str, Scalar], ...], assigned: set[str],
                      line: int) -> None:
        for fld in effect.fields:
            if any(e == effect.name and f == fld.name for e, f, _ in with_values):
                continue
            source = table.events[event].field(fld.name) or table.context_field(fld.name)
            if source is None and fld.type.kind == "optional":
                continue  # nothing to fill it from: None
            if source is None:
                self.fail(line, "no-source",
                          f"effect {effect.name}.{fld.name} has no source: no with:, no field "
                          f"of event {event}, no context field of that name")
            if not fld.type.accepts(source.type):
                self.fail(line, "type-mismatch", f"effect {effect.name}.{fld.name} is "
                          f"{fld.type}, its source {source.name} is {source.type}")

    def check_group(self, rows: list[Row]) -> None:
        first = rows[0]
        where = f"{first.source} on {first.event}"
        seen: set[str | None] = set()
        for row in rows:
            if row.guard in seen:
                self.fail(row.line, "duplicate-row",
                          f"duplicate row for {where}"
                          + (f" with guard {row.guard}" if row.guard else ""))
            seen.add(row.guard)
        if len(rows) == 1 and first.guard is None:
            return
        for row in rows[:-1]:
            if row.guard == "else":
                self.fail(rows[-1].line, "guard-else",
                          f"guarded group {where}: row after its `else`")
            if row.guard is None:
                self.fail(row.line, "guard-else",
                          f"guarded group {where}: an unguarded row before the last row")
        if rows[-1].guard != "else":
            self.fail(rows[-1].line, "guard-else",
                      f"guarded group {where} must end with a `guard: else` row")


def _with_source(row: Row, source: str) -> Row:
    return Row(source=source, event=row.event, guard=row.guard, target=row.target,
               effects=row.effects, with_values=row.with_values, assign=row.assign,
               fault=row.fault, doc=row.doc, line=row.line, wildcard=row.wildcard,
               index=row.index)
