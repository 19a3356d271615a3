"""Count the uses of `typing.Any` in each module of `swactor` (test rigs excluded).

`python -m tests.hygiene.any_count` prints one line per module that uses `Any`, most
first, each marked `boundary` when the module is one of `BOUNDARY` (where untyped data
or untyped libraries meet our types), then the totals that `test_any_ratchet.py` holds.

A use is a reference to the name `Any` (or `typing.Any`) in code, including inside
string annotations (`"dict[str, Any]"`); the import itself, comments and prose are not
uses.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swactor"
EXCLUDED = (PACKAGE / "testing",)

#: Modules where `Any` stands for data or objects that have no static type here: parsed
#: JSON (wire codec, event logs, membership datagrams, fault files, replayed traces),
#: tinygrad tensors and numpy arrays (model and worker), aioquic's untyped internals
#: (the transport's flow-control override and bulk path), cffi handles (ring, UDP).
BOUNDARY: dict[str, str] = {
    "swactor/wire/codec.py": "JSON",
    "swactor/events/schema.py": "JSON",
    "swactor/events/wait.py": "JSON",
    "swactor/membership/wire.py": "JSON",
    "swactor/membership/cli.py": "JSON",
    "swactor/check/replay.py": "JSON",
    "swactor/faults/__init__.py": "JSON",
    "swactor/faults/table.py": "JSON",
    "swactor/imagecheck/compose.py": "JSON (compose file)",
    "swactor/model/llama_role.py": "tinygrad",
    "swactor/model/dequant.py": "tinygrad, numpy",
    "swactor/model/jit_cache.py": "tinygrad",
    "swactor/model/gguf_header.py": "gguf reader",
    "swactor/model/gguf_range.py": "gguf reader, numpy",
    "swactor/model/vocab.py": "gguf reader",
    "swactor/model/tokenizer.py": "tokenizers",
    "swactor/model/stage.py": "numpy",
    "swactor/model/cpu_graph.py": "numpy",
    "swactor/model/sampling.py": "numpy",
    "swactor/model/chat.py": "JSON (chat template)",
    "swactor/model/artifact_server.py": "http.server",
    "swactor/worker/llama_stage.py": "tinygrad",
    "swactor/worker/bridge.py": "tinygrad",
    "swactor/transport/flow.py": "aioquic internals",
    "swactor/transport/bulk.py": "aioquic internals, cffi",
    "swactor/transport/udp.py": "cffi",
    "swactor/ring/ring.py": "cffi",
}


def uses(source: str) -> int:
    """How many times `source` refers to `Any` (see the module docstring)."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if is_any(node):
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
            try:
                annotation = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue  # prose
            count += sum(1 for inner in ast.walk(annotation) if is_any(inner))
    return count


def is_any(node: ast.AST) -> bool:
    """`Any` or `typing.Any` read (an enum member or a class attribute named `Any` is
    not the type)."""
    if isinstance(node, ast.Name):
        return node.id == "Any" and isinstance(node.ctx, ast.Load)
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "Any"
        and isinstance(node.value, ast.Name)
        and node.value.id == "typing"
    )


def counts(package: Path = PACKAGE) -> Counter[str]:
    """Uses of `Any` per module path (relative to the repository root)."""
    found: Counter[str] = Counter()
    for path in sorted(package.rglob("*.py")):
        if any(excluded in path.parents for excluded in EXCLUDED):
            continue
        n = uses(path.read_text())
        if n:
            found[path.relative_to(package.parent).as_posix()] = n
    return found


def split(found: Mapping[str, int]) -> tuple[int, int]:
    """(uses in boundary modules, uses elsewhere)."""
    boundary = sum(n for module, n in found.items() if module in BOUNDARY)
    return boundary, sum(found.values()) - boundary


def main() -> int:
    found = counts()
    for module, n in sorted(found.items(), key=lambda item: (-item[1], item[0])):
        mark = f"  boundary: {BOUNDARY[module]}" if module in BOUNDARY else ""
        print(f"{n:5d}  {module}{mark}")
    boundary, elsewhere = split(found)
    print(f"total {boundary + elsewhere}: {boundary} in boundary modules, {elsewhere} elsewhere")
    return 0


if __name__ == "__main__":
    sys.exit(main())
