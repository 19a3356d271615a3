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

USAGE = """usage: python -m bench [NAME [OPTIONS...]]...

With no NAME, runs `report` (every benchmark; writes bench/report.md and report.json).
Each NAME runs that benchmark; the words after it, up to the next NAME, are its options
(`python -m bench quic --repeat 3`; `python -m bench NAME --help` lists them).
Benchmarks: {names}"""


def available() -> list[str]:
    """Benchmark module names, sorted."""
    here = str(Path(__file__).parent)
    return sorted(
        info.name for info in pkgutil.iter_modules([here]) if not info.name.startswith("_")
    )


def split_groups(argv: list[str], names: list[str]) -> list[tuple[str, list[str]]]:
    """Split ``argv`` into (benchmark, its arguments): a word naming a benchmark starts a
    group and every following word that is not a benchmark name is passed to it, so
    ``quic --repeat 3 model --beam 2`` runs two benchmarks with their own options."""
    groups: list[tuple[str, list[str]]] = []
    for word in argv:
        if word in names:
            groups.append((word, []))
        elif groups:
            groups[-1][1].append(word)
        else:
            raise ValueError(word)
    return groups


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.format(names=", ".join(available())))
        return 0
    have = available()
    try:
        groups = split_groups(argv, have) if argv else [("report", [])]
    except ValueError as bad:
        print(f"bench: unknown benchmark {bad}; have: {', '.join(have)} "
              "(options go after the benchmark's name)", file=sys.stderr)
        return 2
    status = 0
    for name, args in groups:
        print(f"== bench {name} ==", flush=True)
        module = importlib.import_module(f"bench.{name}")
        status |= int(module.main(args))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
