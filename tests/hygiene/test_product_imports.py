"""The product imports no test-only package.

Every module of `swactor` except `swactor/testing` is parsed (not imported) and each
`import`, `from ... import` (at any depth: inside functions and `TYPE_CHECKING` blocks
too, relative ones resolved) and each string that is exactly a module name (what
`python -m NAME` or `importlib.import_module(NAME)` would load) is checked against the
test-only roots: Hypothesis, pytest and `swactor.testing`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swactor"
TEST_ONLY = ("hypothesis", "pytest", "_pytest", "swactor.testing")
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(source: str, name: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module name) of everything `source` (module `name`) imports or names."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_NAME.match(node.value)
        ):
            yield node.lineno, node.value


def is_test_only(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in TEST_ONLY)


def violations(source: str, name: str, is_package: bool = False) -> list[str]:
    return [
        f"{name}:{line}: imports {module}"
        for line, module in imported_names(source, name, is_package)
        if is_test_only(module)
    ]


def product_modules() -> list[Path]:
    testing = PACKAGE / "testing"
    return sorted(p for p in PACKAGE.rglob("*.py") if testing not in p.parents)


def test_no_product_module_imports_a_test_only_package() -> None:
    modules = product_modules()
    assert len(modules) > 100  # the walk really found the package
    found = [
        violation
        for path in modules
        for violation in violations(
            path.read_text(), module_name(path), path.name == "__init__.py"
        )
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import hypothesis.strategies as st",
        "from hypothesis import given",
        "def f():\n    import pytest",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from _pytest.fixtures import X",
        "from swactor.testing.examples import example",
        "from swactor import testing",
        "from ..testing import ring_rig",
        "import subprocess\nsubprocess.run(['python', '-m', 'swactor.testing.ring_peer'])",
    ],
)
def test_the_check_sees_each_kind_of_import(source: str) -> None:
    assert violations(source, "swactor.ring.ring")


def test_the_check_passes_product_imports_and_prose() -> None:
    source = (
        '"""See swactor.testing.examples for example values."""\n'
        "import pytesting_helpers\nfrom swactor.wire import RunId\nfrom . import errors\n"
    )
    assert violations(source, "swactor.ring.ring") == []
