"""`swactor events FILE...`: merge several processes' event files and filter them.

Each process writes its own JSON Lines file. Monotonic clocks differ between processes
(and machines), so files are merged by `wall` time; events with equal wall times keep
the order of the files on the command line, then their order within the file (a stable
sort). Every line is schema-checked: a bad line is reported on stderr as
`FILE:LINE: problem` and skipped (`--strict` makes it fatal, exit 1). Filters (`--run`,
`--node`, `--edge`, `--stage`, `--event`, repeatable) keep the events that carry the
given identities; the output is a human table, or the lines as JSON with `--json`.
Exit status 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from swactor.events.schema import Emitted, EventSchemaError, validate_line
from swactor.events.sinks import describe, format_wall


@dataclass(frozen=True, slots=True)
class Rejected:
    """A line that failed the schema check."""

    path: str
    line_no: int
    error: EventSchemaError


def read_file(path: str) -> Iterator[tuple[int, Emitted | Rejected]]:
    """(line number, event or rejection) for each non-empty line of `path`."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                yield line_no, validate_line(raw)
            except EventSchemaError as error:
                yield line_no, Rejected(path, line_no, error)


def merge(per_file: Iterable[Iterable[Emitted]]) -> list[Emitted]:
    """Merge by wall time; ties keep file order, then line order."""
    keyed = [
        (emitted.wall, file_index, line_index, emitted)
        for file_index, events in enumerate(per_file)
        for line_index, emitted in enumerate(events)
    ]
    keyed.sort(key=lambda item: item[:3])
    return [item[3] for item in keyed]


def keep(emitted: Emitted, args: argparse.Namespace) -> bool:
    for key, wanted in (
        ("run_id", args.run), ("node_id", args.node), ("edge_id", args.edge),
        ("stage_index", args.stage),
    ):
        if wanted is not None and emitted.value(key) != wanted:
            return False
    return not args.event or emitted.name.value in args.event


def write_table(events: list[Emitted], out: IO[str]) -> None:
    procs = [f"{e.proc}[{e.pid}]" for e in events]
    proc_width = max((len(p) for p in procs), default=4)
    name_width = max((len(e.name.value) for e in events), default=5)
    out.write(f"{'wall (UTC)':<24}  {'proc':<{proc_width}}  {'event':<{name_width}}  fields\n")
    for emitted, proc in zip(events, procs, strict=True):
        out.write(
            f"{format_wall(emitted.wall):<24}  {proc:<{proc_width}}  "
            f"{emitted.name.value:<{name_width}}  {describe(emitted)}\n"
        )


def run(args: argparse.Namespace) -> int:
    per_file: list[list[Emitted]] = []
    for path in args.files:
        events: list[Emitted] = []
        try:
            for _line_no, item in read_file(path):
                if isinstance(item, Rejected):
                    print(f"{item.path}:{item.line_no}: {item.error}", file=sys.stderr)
                    if args.strict:
                        return 1
                else:
                    events.append(item)
        except OSError as error:
            print(f"swactor events: cannot read {path}: {error.strerror or error}",
                  file=sys.stderr)
            return 2
        per_file.append(events)
    merged = [e for e in merge(per_file) if keep(e, args)]
    if args.json:
        for emitted in merged:
            sys.stdout.write(json.dumps(emitted.to_json(), separators=(",", ":")) + "\n")
    else:
        write_table(merged, sys.stdout)
    return 0
