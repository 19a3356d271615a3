"""No import cycle between the packages of `swactor`.

The graph is read from the source by AST, not by importing: a node per package directly
under `swactor/` (`swactor.node`, `swactor.ring`, ...; a top-level module such as
`swactor.cli` is a node of its own), an edge A -> B for every import in a module of A
that names a module or a name of B. Every import counts wherever it stands: at module
level, inside a function (a deferred import is still a dependency) and under
`if TYPE_CHECKING:` (a type-only dependency still ties the packages together).
A strongly connected component of more than one package is a cycle; the failure names
each import that closes it, as `file:line`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "swactor"

Edges = dict[tuple[str, str], list[str]]
"""(importing package, imported package) -> the `file:line module` imports that make it."""


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = path.relative_to(root.parent).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    # `from swactor import ring` imports a package through its parent: name both
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def package_edges(root: Path) -> Edges:
    """The package-level import edges of the tree under `root` (module doc)."""
    top = root.name
    units = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    edges: Edges = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module, is_package = _module_name(path, root)
        parts = module.split(".")
        if len(parts) < 2:
            continue  # the top package's own __init__ belongs to no unit
        source = parts[1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named = _imported(node, module, is_package)
            for target in named:
                bits = target.split(".")
                if len(bits) < 2 or bits[0] != top or bits[1] not in units:
                    continue
                if bits[1] != source:
                    where = f"{path.relative_to(root.parent)}:{node.lineno} {named[0]}"
                    if where not in edges[(source, bits[1])]:
                        edges[(source, bits[1])].append(where)
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan), sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(component: list[str], edges: Edges) -> str:
    lines = [" <-> ".join(component)]
    for (source, target), imports in sorted(edges.items()):
        if source in component and target in component:
            lines.append(f"  {source} -> {target}:")
            lines += [f"    {where}" for where in imports]
    return "\n".join(lines)


def test_swactor_has_no_package_import_cycle() -> None:
    edges = package_edges(ROOT)
    assert ("node", "wire") in edges  # the walk sees the tree at all
    found = cycles(edges)
    assert not found, "package import cycles:\n" + "\n".join(
        describe(component, edges) for component in found
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_deferred_or_relative_import_closes_a_cycle(tmp_path: Path) -> None:
    root = tmp_path / "swactor"
    _write(root, {
        "__init__.py": "",
        "low/__init__.py": "from .core import thing\n",
        "low/core.py": "def thing():\n    from swactor.high import api\n    return api\n",
        "high/__init__.py": "",
        "high/api.py": "from ..low import core\n",
        "cli.py": "from swactor import high\n",
    })
    edges = package_edges(root)
    assert cycles(edges) == [["high", "low"]]
    text = describe(["high", "low"], edges)
    assert "swactor/low/core.py:2 swactor.high" in text
    assert "swactor/high/api.py:1 swactor.low" in text
    assert "swactor/cli.py" not in text
    assert ("cli", "high") in edges


def test_a_type_only_import_counts_and_a_layered_tree_passes(tmp_path: Path) -> None:
    root = tmp_path / "swactor"
    _write(root, {
        "__init__.py": "",
        "low/__init__.py": "",
        "high/__init__.py": "import swactor.low\n",
    })
    assert cycles(package_edges(root)) == []
    _write(root, {
        "low/types.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import swactor.high\n"
        ),
    })
    assert cycles(package_edges(root)) == [["high", "low"]]
