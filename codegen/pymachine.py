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

import json
import re
from typing import Any

from codegen import exprs, pretty
from codegen.fieldtypes import WireNames
from codegen.model import Message, Row, Table
from codegen.templating import render


def _message_class(msg: Message, effect: bool = False) -> list[str]:
    if msg.wire:
        # the shared class itself; an effect's builder stores through its slot setters
        lines = [f"{msg.name} = wire.{msg.name}"]
        lines += pretty.docstring(f"{msg.doc} The class is ``swactor.wire.{msg.name}``.", 0)
        if effect and msg.fields:
            lines.append("")
            for f in msg.fields:
                lines += pretty.call(f"_set_{msg.name}_{f.name} = slot_setter",
                                     [msg.name, f'"{f.name}"'], "", 0)
        return lines
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
        self.args: dict[str, list[str]] = {}  # constructor call text -> its arguments

    def name_for(self, cls: str, args: list[str]) -> str | None:
        if any("event." in arg or "m._" in arg for arg in args):
            return None
        call = f"{cls}({', '.join(args)})"
        self.args.setdefault(call, list(args))
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
                               self.args[call], "", 0)
        return out


def _effect_lines(table: Table, items: list[tuple[str, list[str]]],
                  constants: _Constants) -> list[str]:
    """Builder body: construct the effects, then ``return [...]`` them in order.

    A table effect is made with ``blank(Cls)`` and its slot setters, inline: this skips
    the ``__init__`` frame and halves the cost of building it. Constant effects are
    module constants; the runtime's timer effects use their constructors.
    """
    lines: list[str] = []
    refs: list[str] = []
    for cls, args in items:
        constant = constants.name_for(cls, args)
        if constant is not None:
            refs.append(constant)
            continue
        args = [constants.literal(arg) for arg in args]
        if cls not in table.effects:
            refs.append(f"{cls}({', '.join(args)})")
            continue
        var = f"effect_{sum(ref.startswith('effect_') for ref in refs)}"
        lines.append(f"    {var}: {cls} = blank({cls})")
        for arg in args:
            field_name, _, value = arg.partition("=")
            lines += pretty.call(f"_set_{cls}_{field_name}", [var, value], "", 4)
        refs.append(var)
    one = f"    return [{', '.join(refs)}]"
    if len(one) <= pretty.LIMIT:
        return [*lines, one]
    return [*lines, "    return [", *(f"        {ref}," for ref in refs), "    ]"]


def _builder_body(table: Table, row: Row, wire: WireNames, constants: _Constants) -> list[str]:
    body = [f"    m._{ctx} = event.{field}" for ctx, field in row.assign]
    items = exprs.effect_list(table, row, exprs.MACHINE, wire)
    return body + _effect_lines(table, items, constants)


def _builders(table: Table, wire: WireNames,
              constants: _Constants) -> tuple[list[list[str]], list[str]]:
    """Effect-builder functions (deduplicated by text) and each row's builder name."""
    machine_cls = f"{table.class_prefix}Machine"
    names: dict[str, str] = {}  # summary + body text -> function name
    definitions: list[list[str]] = []
    row_builder: list[str] = []
    for row in table.rows:
        body = _builder_body(table, row, wire, constants)
        summary = _row_summary(row)
        key = f"{row.event}\n{summary}\n" + "\n".join(body)
        if key not in names:
            name = names[key] = f"_row_{len(names)}"
            head = f"def {name}(m: {machine_cls}, event: {row.event}) -> list[Effect]:"
            if len(head) > pretty.LIMIT:
                head = (f"def {name}(\n    m: {machine_cls}, event: {row.event}\n"
                        ") -> list[Effect]:")
            definitions.append(head.split("\n") + pretty.docstring(summary, 4) + body)
        row_builder.append(names[key])
    return definitions, row_builder


def _guards(table: Table) -> tuple[list[list[str]], list[list[str]]]:
    """The ``<Name>Guards`` protocol methods and the module-level guard adapters."""
    guards_cls = f"{table.class_prefix}Guards"
    used_with: dict[str, list[str]] = {g: [] for g in table.guards}
    for row in table.rows:
        if row.guard in used_with and row.event not in used_with[row.guard]:
            used_with[row.guard].append(row.event)
    methods: list[list[str]] = []
    adapters: list[list[str]] = []
    for guard in table.guards.values():
        events = used_with[guard.name] or ["Event"]
        head = [f"    def {guard.name}(self, event: {' | '.join(events)}) -> bool:"]
        if len(head[0]) > pretty.LIMIT:
            union = pretty.union(events, 8, "event: ")
            union[-1] += ","
            head = [f"    def {guard.name}(", "        self,", *union, "    ) -> bool:"]
        methods.append(head + pretty.docstring(guard.doc, 8) + ["        ..."])
        adapter = pretty.call(f"def _guard_{guard.name}",
                              [f"guards: {guards_cls}", f"event: {' | '.join(events)}"],
                              " -> bool:", 0)
        adapters.append([*adapter, f"    return guards.{guard.name}(event)"])
    return methods, adapters


def _effects_port(table: Table) -> tuple[list[list[str]], list[str], list[str]]:
    """The ``<Name>Effects`` protocol methods, the ``EFFECT_METHODS`` entries and the
    entries of the dict ``bind(port)`` returns: effect class -> port method call."""
    methods: list[list[str]] = []
    names: list[str] = []
    bound: list[str] = []
    for name, method in table.effect_methods.items():
        effect = table.effects.get(name)
        if effect is None:  # the built-in ProtocolViolation
            params = [("machine", "str"), ("state", "str"), ("event", "str")]
            doc = ("An event no row handles arrived (``unhandled: fault``); the machine "
                   "moved to its fault state. Names only, never the event's payload.")
        else:
            params = [(f.name, f.type.python()) for f in effect.fields]
            doc = effect.doc
        head = pretty.call(f"def {method}", ["self", *(f"{n}: {t}" for n, t in params)],
                           " -> Result:", 4)
        methods.append(head + pretty.docstring(doc, 8) + ["        ..."])
        names.append(f'    "{name}": "{method}",')
        args = [f"e.{n}" for n, _ in params]
        one = f"        on_effect({name}, lambda e: port.{method}({', '.join(args)})),"
        bound += [one] if len(one) <= pretty.LIMIT else [
            "        on_effect(", f"            {name},",
            *pretty.call(f"lambda e: port.{method}", args, ",", 12), "        ),"]
    return methods, names, bound


def _table_lines(table: Table, row_builder: list[str]) -> list[str]:
    """The entries of ``_TABLE``, in state then event order."""
    states, events = list(table.states), list(table.events)
    entries: dict[tuple[str, str], list[str]] = {}
    for row, builder in zip(table.rows, row_builder, strict=True):
        guard = f"_guard_{row.guard}" if row.guard not in (None, "else") else "None"
        target = f"State.{row.target}" if row.target else "None"
        entries.setdefault((row.source, row.event), []).append(f"({guard}, {target}, {builder}),")
    ignored = [(s, e) for s in states for e in events if table.outcome(s, e) == "ignore"]
    lines: list[str] = []
    for pair in sorted([*entries, *ignored],
                       key=lambda k: (states.index(k[0]), events.index(k[1]))):
        lead = f"    (State.{pair[0]}, {pair[1]}): "
        rows = entries.get(pair)
        if rows is None:
            lines.append(f"{lead}_IGNORED,")
        elif len(rows) == 1 and len(f"{lead}({rows[0]}),") <= pretty.LIMIT:
            lines.append(f"{lead}({rows[0]}),")
        else:
            lines += [lead + "(", *(f"        {r}" for r in rows), "    ),"]
    return lines


def _fault_lines(table: Table) -> list[str]:
    """The body of ``_unhandled`` under the ``fault`` policy (before the map switch)."""
    if table.unhandled != "fault":
        return []
    assert table.fault_state is not None
    lines = ["        effects: list[Effect] = "
             "[ProtocolViolation(MACHINE, self._state.name, name)]"]
    if any(s.timer is not None for s in table.states.values()):
        lines += ["        timer = _TIMERS.get(self._state)",
                  "        if timer is not None:",
                  "            effects.append(CancelTimer(timer))"]
    fault_timer = table.states[table.fault_state].timer
    if fault_timer is not None:
        seconds = exprs.timer_seconds(table, table.fault_state, None, exprs.MACHINE)
        lines.append(f'        effects.append(StartTimer("{fault_timer.event}", '
                     f'{seconds.replace("m._", "self._")}))')
    return [*lines, f"        self._state = State.{table.fault_state}"]


def module_source(table: Table, wire: WireNames) -> str:
    """The text of ``swactor/fsm/generated/<machine>.py``."""
    constants = _Constants()
    builders, row_builder = _builders(table, wire, constants)
    guard_methods, guard_adapters = _guards(table)
    effect_methods, port_names, bound = _effects_port(table)
    timed = {s.name: s.timer for s in table.states.values() if s.timer is not None}
    effect_names = list(table.effects)
    if timed:
        effect_names += ["StartTimer", "CancelTimer"]
    if table.unhandled == "fault":
        effect_names.append("ProtocolViolation")
    messages = [*table.events.values(), *table.effects.values()]
    setters = [m for m in table.events.values() if not m.wire] + list(table.effects.values())
    runtime_imports = sorted({"ProtocolError", "R", "Result"}
                             | ({"on_effect"} if bound else set())
                             | set(effect_names) - set(table.effects)
                             | ({"slot_setter"} if any(m.fields for m in setters) else set())
                             | ({"blank"} if any(m.fields for m in table.effects.values())
                                else set()))
    uses_wire = (any(m.wire for m in messages)
                 or any(f.type.names() for m in messages for f in m.fields)
                 or any(f.type.names() for f in table.context))
    slot_names = ["guards", "state", "events", *(f.name for f in table.context)]
    context: dict[str, Any] = {
        "table": table,
        "doc": pretty.docstring(table.doc, 0),
        "machine_cls": f"{table.class_prefix}Machine",
        "guards_cls": f"{table.class_prefix}Guards",
        "uses_wire": uses_wire,
        "runtime_import": pretty.import_from("swactor.fsm.runtime", runtime_imports),
        "states": [(s.name, pretty.docstring(s.doc, 4)) for s in table.states.values()],
        "events": [_message_class(m) for m in table.events.values()],
        "effects": [_message_class(m, effect=True) for m in table.effects.values()],
        "event_union": pretty.union(list(table.events), 0, "Event: TypeAlias = "),
        "effect_union": (pretty.union(effect_names, 0, "Effect: TypeAlias = ")
                         if effect_names else ["Effect: TypeAlias = Never"]),
        "guard_methods": guard_methods,
        "guard_adapters": guard_adapters,
        "effects_cls": f"{table.class_prefix}Effects",
        "effect_methods": effect_methods,
        "port_names": port_names,
        "bound": bound,
        "effects_doc": pretty.docstring(
            f"The effects of {table.machine}: one method per effect the table names, its "
            "fields as arguments in table order. A binding implements it; ``bind`` maps "
            "each effect class onto its method and a host of ``swactor.fsm.host`` calls "
            "them in row order. ``Result`` is ``None`` for a binding carried out at once, an "
            "awaitable for one whose host awaits each effect.", 4),
        "builders": builders,
        "constants": constants.lines(),
        "table_lines": _table_lines(table, row_builder),
        "event_list": list(table.events),
        "terminal": [s.name for s in table.states.values() if s.terminal],
        "timed": [(name, timer.event) for name, timer in timed.items()],
        "timer_events": sorted({t.event for t in timed.values()}),
        "fault_lines": _fault_lines(table),
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
        "slots": pretty.call("__slots__ = ", [f'"{n}"' for n in pretty.natural_sorted(
            [f"_{n}" for n in slot_names])], "", 4),
        "all_names": pretty.all_sorted([
            f"{table.class_prefix}Machine", f"{table.class_prefix}Guards",
            f"{table.class_prefix}Effects", "EFFECT_METHODS", "Effect", "Event", "MACHINE",
            "MODEL", "SPEC", "State", "TIMER_EVENTS", "bind", *table.events,
            *table.effects]),
        "model": _model_lines(table),
    }
    return render("machine.py.j2", **context)


def _literal(value: object) -> str:
    """A scalar as Python source (strings in double quotes, as ruff's style has them)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _layout(value: object, indent: int, lead: str = "", tail: str = "") -> list[str]:
    """``lead + value + tail`` as Python source within the line limit: a tuple (or a
    call of ``Name`` with a tuple of arguments) on one line when it fits, else one element
    per line, each laid out the same way."""
    pad = " " * indent
    if isinstance(value, _Call):
        inner = [_flat(item) for item in value.args]
        one = f"{pad}{lead}{value.name}({', '.join(inner)}){tail}"
        if len(one) <= pretty.LIMIT:
            return [one]
        out = [f"{pad}{lead}{value.name}("]
        for item in value.args:
            out += _layout(item, indent + 4, "", ",")
        return [*out, f"{pad}){tail}"]
    if isinstance(value, tuple):
        one = f"{pad}{lead}{_flat(value)}{tail}"
        if len(one) <= pretty.LIMIT:
            return [one]
        out = [f"{pad}{lead}("]
        for item in value:
            out += _layout(item, indent + 4, "", ",")
        return [*out, f"{pad}){tail}"]
    return [f"{pad}{lead}{_flat(value)}{tail}"]


class _Call:
    """``name(args...)`` for `_layout` (keyword arguments are ``_Kw``)."""

    def __init__(self, name: str, *args: object) -> None:
        self.name = name
        self.args = args


class _Kw:
    def __init__(self, key: str, value: object) -> None:
        self.key = key
        self.value = value


def _flat(value: object) -> str:
    if isinstance(value, _Kw):
        return f"{value.key}={_flat(value.value)}"
    if isinstance(value, _Call):
        return f"{value.name}({', '.join(_flat(a) for a in value.args)})"
    if isinstance(value, tuple):
        items = [_flat(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return _literal(value)


def _model_lines(table: Table) -> list[str]:
    """``MODEL: Final = MachineModel(...)``: the table as data (``swactor.fsm.model``)."""
    rows = tuple(
        _Call("Transition", row.source, row.event, row.guard, row.target, row.effects,
              row.with_values, row.fault)
        for row in table.rows
    )
    ignored = tuple(sorted((s, e) for s in table.states for e in table.events
                           if table.outcome(s, e) == "ignore"))
    states = table.states.values()
    model = _Call(
        "MachineModel",
        _Kw("machine", table.machine),
        _Kw("spec", table.spec),
        _Kw("initial", table.initial),
        _Kw("states", tuple(table.states)),
        _Kw("terminal", _Call("frozenset", *((tuple(s.name for s in states if s.terminal),)
                                             if any(s.terminal for s in states) else ()))),
        _Kw("fault_states", _Call("frozenset", *((tuple(s.name for s in states if s.fault),)
                                                 if any(s.fault for s in states) else ()))),
        _Kw("events", tuple(table.events)),
        _Kw("effects", tuple(table.effects)),
        _Kw("transitions", rows),
        _Kw("ignored", _Call("frozenset", *((ignored,) if ignored else ()))),
        _Kw("unhandled", table.unhandled),
        _Kw("fault_state", table.fault_state),
    )
    out = [f"{' ' * 0}MODEL: Final = MachineModel("]
    for arg in model.args:
        assert isinstance(arg, _Kw)
        out += _layout(arg.value, 4, f"{arg.key}=", ",")
    return [*out, ")", '"""This table as data (``swactor.fsm.model``): rows, ignores, policy."""']


def _row_summary(row: Row) -> str:
    guard = f" [{row.guard}]" if row.guard else ""
    target = f" -> {row.target}" if row.target else " (internal)"
    return f"{row.event}{guard}{target}: {', '.join(row.effects) or 'no effects'}."
