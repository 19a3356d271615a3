"""Benchmark dispatcher: ``python -m bench`` runs the report (every module); with names, those.

Theory of operation: each benchmark is a module in this package exposing
``main(argv: list[str]) -> int``; it prints its own figures and side-by-side ratios. The
dispatcher discovers modules by file name, so adding a benchmark needs no edit here.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    """Benchmark module names, sorted."""
    here = str(Path(__file__).parent)
    return sorted(
        info.name for info in pkgutil.iter_modules([here]) if not info.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    names = argv or ["report"]  # the report runs every other module (bench/report.py)
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(f"bench: unknown benchmark(s): {', '.join(unknown)}; have: {', '.join(available())}",
              file=sys.stderr)
        return 2
    status = 0
    for name in names:
        print(f"== bench {name} ==", flush=True)
        module = importlib.import_module(f"bench.{name}")
        status |= int(module.main([]))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
