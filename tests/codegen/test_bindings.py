"""Every binding implements its table's generated ``<Prefix>Effects`` protocol.

``mypy --strict`` proves it statically (a binding subclasses its protocol, so a missing
method makes the class abstract and its construction an error; ``bind(self)`` checks the
signatures). This is the same check at run time, over the source tree: every module of
``swactor`` that constructs a generated machine defines a class that subclasses that
machine's Effects protocol and implements each of its methods with the table's
parameters, so a binding cannot silently drop an effect.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import swactor
import swactor.fsm.generated as generated
from swactor.fsm.generated import edge_teardown as et
from swactor.wire import EdgeId, RingId, UninstallReason

ROOT = Path(swactor.__file__).parent
TABLES: dict[str, ModuleType] = {}
for _info in pkgutil.iter_modules(generated.__path__):
    _module = importlib.import_module(f"{generated.__name__}.{_info.name}")
    TABLES[_module.MACHINE] = _module


def _prefix(module: ModuleType) -> str:
    return "".join(part.capitalize() for part in module.MACHINE.split("_"))


def construction_sites() -> dict[str, set[str]]:
    """Module name -> the tables whose machine it constructs (a ``<Prefix>Machine(...)``
    call in its code, docstrings aside)."""
    by_prefix = {f"{_prefix(m)}Machine": name for name, m in TABLES.items()}
    sites: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if generated.__path__[0] in str(path):
            continue
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in by_prefix:
                    found.add(by_prefix[name])
        if found:
            module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
            sites[module] = found
    return sites


def missing_effects(cls: type, table: ModuleType) -> list[str]:
    """The Effects methods `cls` does not implement, or implements with other parameters."""
    protocol = getattr(table, f"{_prefix(table)}Effects")
    problems = []
    for method in table.EFFECT_METHODS.values():
        stub = vars(protocol)[method]
        implementation = getattr(cls, method, None)
        if implementation is None or implementation is stub or not callable(implementation):
            problems.append(f"{method}: missing")
            continue
        want = list(inspect.signature(stub).parameters)
        got = list(inspect.signature(implementation).parameters)
        if got != want:
            problems.append(f"{method}: parameters {got}, the table says {want}")
    return problems


SITES = construction_sites()


def test_every_table_has_a_binding() -> None:
    bound = {table for tables in SITES.values() for table in tables}
    assert bound == set(TABLES)


@pytest.mark.parametrize("module_name", sorted(SITES))
def test_binding_implements_every_effect_of_its_table(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for machine in sorted(SITES[module_name]):
        table = TABLES[machine]
        protocol = getattr(table, f"{_prefix(table)}Effects")
        bindings = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if cls.__module__ == module_name and protocol in cls.__mro__]
        assert bindings, f"{module_name} runs {machine} but no class implements {protocol}"
        for cls in bindings:
            assert missing_effects(cls, table) == [], cls


class _Complete(et.EdgeTeardownEffects[None]):
    def stop_pump(self, edge_id: EdgeId) -> None: ...

    def uninstall_ring(self, ring_id: RingId, reason: UninstallReason) -> None: ...

    def release_ring(self, ring_id: RingId, worker_reaped: bool) -> None: ...

    def edge_torn_down(self, edge_id: EdgeId, clean: bool) -> None: ...


def test_a_binding_missing_an_effect_or_renaming_a_field_is_caught() -> None:
    assert missing_effects(_Complete, et) == []

    class Missing(et.EdgeTeardownEffects[None]):  # no edge_torn_down
        def stop_pump(self, edge_id: EdgeId) -> None: ...

        def uninstall_ring(self, ring_id: RingId, reason: UninstallReason) -> None: ...

        def release_ring(self, ring_id: RingId, worker_reaped: bool) -> None: ...

    class Renamed(_Complete):
        def release_ring(self, ring: RingId, worker_reaped: bool) -> None:  # type: ignore[override]
            ...

    assert missing_effects(Missing, et) == ["edge_torn_down: missing"]
    assert missing_effects(Renamed, et) == [
        "release_ring: parameters ['self', 'ring', 'worker_reaped'], "
        "the table says ['self', 'ring_id', 'worker_reaped']"]
