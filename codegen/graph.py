"""Graph rules of a table: every state reachable, every non-terminal state able to end.

Theory of operation
-------------------
Edges are the rows with a ``to:`` (internal rows stay put) plus, under the
``unhandled: fault`` policy, an implicit edge from every non-terminal state that leaves
some event unhandled to the fault state. A forward search from the initial state finds
unreachable states; a backward search from the terminal states finds states that can
never finish. Both report the first offending state in YAML order.
"""

from __future__ import annotations

from collections import deque

from codegen.errors import TableError
from codegen.model import Table


def edges(table: Table) -> dict[str, set[str]]:
    """State -> states one row (or the fault policy) can move it to."""
    out: dict[str, set[str]] = {name: set() for name in table.states}
    for row in table.rows:
        if row.target is not None:
            out[row.source].add(row.target)
    if table.unhandled == "fault" and table.fault_state is not None:
        for state in table.states.values():
            if not state.terminal and any(
                table.outcome(state.name, event) == "fault" for event in table.events
            ):
                out[state.name].add(table.fault_state)
    return out


def _closure(start: list[str], step: dict[str, set[str]]) -> set[str]:
    seen = set(start)
    queue = deque(start)
    while queue:
        for nxt in sorted(step[queue.popleft()]):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def check_graph(table: Table) -> None:
    forward = edges(table)
    reached = _closure([table.initial], forward)
    for state in table.states.values():
        if state.name not in reached:
            raise TableError(table.path, state.line, "unreachable",
                             f"state {state.name} is unreachable from {table.initial}")
    backward: dict[str, set[str]] = {name: set() for name in table.states}
    for source, targets in forward.items():
        for target in targets:
            backward[target].add(source)
    terminals = [s.name for s in table.states.values() if s.terminal]
    finishing = _closure(terminals, backward)
    for state in table.states.values():
        if state.name not in finishing:
            raise TableError(table.path, state.line, "no-terminal-path",
                             f"no terminal state can be reached from {state.name}")
