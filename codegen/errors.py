"""The one exception type of the codegen: a table that breaks a schema rule.

Every rejection names the file, the 1-based line, a short rule slug (the list is in
``RULES``; ``fsm/README.md`` "Validation" explains each) and a message, and prints as
``file:line: rule: message`` so editors can jump to it.
"""

from __future__ import annotations

from pathlib import Path

RULES: frozenset[str] = frozenset(
    {
        "yaml",  # the file is not valid YAML
        "on-key",  # a key `on:` (YAML 1.1 reads it as a boolean)
        "schema",  # missing/unknown key, wrong shape, duplicate mapping key
        "missing-doc",  # a state, event, effect, guard, field or the table lacks doc:
        "name",  # an invalid or clashing identifier
        "initial",  # not exactly one initial state
        "unknown-name",  # unknown state, event, effect, guard or context field
        "unknown-type",  # a field type that is neither builtin nor exported by swactor.wire
        "type-mismatch",  # a value copied into a field of another type
        "no-source",  # an effect field with no with:, event or context source
        "duplicate-row",  # two rows for the same state, event and guard
        "guard-else",  # a guarded group without a final else, or rows after it
        "terminal-row",  # a row out of a terminal state
        "fault-state",  # fault policy without a valid fault_state
        "timer",  # a timer on an initial/terminal state, with fields, or bad `after`
        "unreachable",  # a state unreachable from the initial state
        "no-terminal-path",  # a non-terminal state that cannot reach a terminal state
    }
)


class TableError(Exception):
    """A table in ``fsm/`` that the codegen refuses."""

    def __init__(self, path: Path | str, line: int, rule: str, message: str) -> None:
        assert rule in RULES, rule
        self.path = str(path)
        self.line = line
        self.rule = rule
        self.message = message
        super().__init__(f"{self.path}:{line}: {rule}: {message}")
