"""Any damage to a valid table gives a ``TableError``, never another exception.

Hypothesis replaces one node of a parsed valid table (the fixture ``lease_desk``) with an
arbitrary YAML value, or deletes it, dumps the result back to YAML and loads it; a table
that still loads must still generate valid Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen.dot import dot_source
from codegen.errors import TableError
from codegen.fieldtypes import WireNames
from codegen.loader import load_table
from codegen.pymachine import module_source
from codegen.pytests import conformance_source

SOURCE = Path(__file__).parent / "fixtures" / "good" / "lease_desk.yaml"
BASE = yaml.safe_load(SOURCE.read_text(encoding="utf-8"))

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2),
                    st.sampled_from(["", "*", "else", "Ready", "Lease", "Granted", "fits_now",
                                     "int", "bytes", "x y", "on", "Rejected.reason",
                                     'say "hi"', "back\\slash", 'ends in a quote"',
                                     "'" * 3, '"' * 3, "word " * 30]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(scalars.filter(lambda v: v is not None),
                                                 inner, max_size=3)), max_leaves=6)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


PATHS = _paths(BASE)
WIRE = WireNames()


def _damaged(path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    table = yaml.safe_load(yaml.safe_dump(BASE))
    parent = table
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return table


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), values, st.booleans())
def test_damaged_table_loads_or_raises_table_error(tmp_path_factory: Any, path: tuple[Any, ...],
                                                   value: Any, delete: bool) -> None:
    target = tmp_path_factory.mktemp("fuzz") / "lease_desk.yaml"
    target.write_text(yaml.safe_dump(_damaged(path, value, delete)), encoding="utf-8")
    try:
        table = load_table(target)
    except TableError:
        return
    # a table that loads must also generate: module, diagram and tests
    compile(module_source(table, WIRE), "machine", "exec")
    assert dot_source(table).startswith("//")
    compile(conformance_source(table, WIRE, target.parent, target.parent), "test", "exec")
