"""Write ``diagrams/<machine>.dot`` for one table.

Theory of operation
-------------------
One node per state, in table order; the initial state is marked by an arrow from a
point, terminal states are double octagons, fault states are filled red. One edge per
expanded row that moves the state (wildcard rows are drawn from every state they were
expanded onto), labelled ``Event [guard] / effects`` (``[else]`` for the closing row of a
guarded group); fault edges are dashed red. A state's internal rows (no ``to:``) are
listed on one grey self-loop. The unhandled-event
policy, when it is ``fault``, is one dashed edge from an "any other event" note to the
fault state, so the diagram shows it without one edge per state. Output is sorted and
stable so that one changed row changes only the lines of that row.
"""

from __future__ import annotations

from codegen.model import Row, Table
from codegen.templating import render


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _quote(*lines: str) -> str:
    """A DOT string; several lines are joined by DOT's centred line break."""
    return '"' + "\\n".join(_escape(line) for line in lines) + '"'


def _edge(row: Row) -> str:
    guard = f" [{row.guard}]" if row.guard else ""
    lines = [f"{row.event}{guard}"] + (["/ " + ", ".join(row.effects)] if row.effects else [])
    label = _quote(*lines)
    target = row.target or row.source
    attrs = [f"label={label}"]
    if row.fault:
        attrs += ["style=dashed", "color=firebrick", "fontcolor=firebrick"]
    return f"  {_quote(row.source)} -> {_quote(target)} [{', '.join(attrs)}];"


def dot_source(table: Table) -> str:
    nodes: list[str] = []
    for state in table.states.values():
        attrs = ["shape=box", "style=rounded"]
        if state.terminal:
            attrs = ["shape=doubleoctagon"]
        if state.fault:
            attrs += ["style=filled", "fillcolor=mistyrose", "color=firebrick"]
        elif state.terminal:
            attrs += ["style=filled", "fillcolor=honeydew"]
        if state.initial:
            attrs += ["penwidth=2"]
        lines = [state.name]
        if state.timer is not None:
            lines.append(f"(timer {state.timer.event})")
        nodes.append(f"  {_quote(state.name)} [label={_quote(*lines)}, {', '.join(attrs)}];")
    edges: list[str] = []
    loops: dict[str, list[str]] = {}
    for row in table.rows:
        if row.target is None:
            guard = f" [{row.guard}]" if row.guard else ""
            effects = f" / {', '.join(row.effects)}" if row.effects else ""
            loops.setdefault(row.source, []).append(f"{row.event}{guard}{effects}")
        else:
            edges.append(_edge(row))
    for source, lines in loops.items():
        edges.append(f"  {_quote(source)} -> {_quote(source)} [label={_quote(*lines)}, "
                      "color=gray50, fontcolor=gray40];")
    title = f"{table.machine} ({table.spec})"
    policy = f"unhandled events: {table.unhandled}"
    return render("machine.dot.j2", table=table, title=_quote(title, policy), nodes=nodes,
                  edges=edges,
                  initial=_quote(table.initial), fault_state=(
                      _quote(table.fault_state) if table.unhandled == "fault"
                      and table.fault_state else None))
