"""``python -m codegen``: regenerate, check or render everything derived from ``fsm/``.

Theory of operation
-------------------
Default: load and validate every table, then write the generated machine modules,
diagrams (``.dot``), conformance tests, ``diagrams/README.md`` and the protocol index
``docs/protocols/index.md`` (only files whose text changed) and delete generated files
no table produces. ``--check`` writes nothing and exits 1 listing stale, missing and
extra files and stale SVGs. ``--render`` runs Graphviz
on every planned ``.dot`` whose SVG is stale. A bad table exits 2 with
``file:line: rule: message``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from codegen.errors import TableError
from codegen.generate import DIAGRAM_DIR, check, plan, write
from codegen.svg import RenderError, render_svg

REPO_ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m codegen",
        description="Generate typed machines (swactor/fsm/generated/), diagrams (diagrams/) "
        "and conformance tests (tests/generated/) from the protocol tables in fsm/*.yaml.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 and list every stale, missing or extra "
                      "generated file (and stale SVGs)")
    mode.add_argument("--render", action="store_true",
                      help="render diagrams/*.dot to SVG with Graphviz (after regenerating) "
                      "and refresh diagrams/README.md")
    parser.add_argument("--force", action="store_true", help="with --render: re-render all")
    parser.add_argument("--fsm-dir", type=Path, default=None,
                        help="folder of the YAML tables (default: <out-root>/fsm)")
    parser.add_argument("--out-root", type=Path, default=REPO_ROOT,
                        help="root the generated paths are relative to (default: the repo)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out_root: Path = args.out_root
    fsm_dir: Path = args.fsm_dir if args.fsm_dir is not None else out_root / "fsm"
    try:
        files = plan(fsm_dir, out_root)
    except TableError as exc:
        print(f"codegen: error: {exc}", file=sys.stderr)
        return 2
    tables = sum(1 for rel in files if rel.suffix == ".dot")
    print(f"codegen: {tables} tables in {fsm_dir}", file=sys.stderr)
    if args.check:
        report = check(files, out_root)
        for line in report.lines():
            print(f"codegen: {line}", file=sys.stderr)
        if not report.clean:
            print("codegen: generated files are stale; run `just codegen` and `just diagrams`",
                  file=sys.stderr)
            return 1
        print("codegen: all generated files are fresh", file=sys.stderr)
        return 0
    changed = write(files, out_root)
    print(f"codegen: {len(changed)} files changed", file=sys.stderr)
    if args.render:
        try:
            for rel in sorted(p for p in files if p.suffix == ".dot"):
                if render_svg(out_root / rel, force=args.force):
                    print(f"codegen: rendered {rel.with_suffix('.svg')}", file=sys.stderr)
        except RenderError as exc:
            print(f"codegen: error: {exc}", file=sys.stderr)
            return 2
        print(f"codegen: diagrams fresh in {out_root / DIAGRAM_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
