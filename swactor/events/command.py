"""The `swactor events` subcommand's arguments, kept light for `swactor --help`.

Only the parser lives here; `swactor.events.cli` (merge, filter, print) and the event
schema are imported when the command runs.
"""

from __future__ import annotations

import argparse

from swactor.events.names import EventName

DESCRIPTION = """\
Merge several processes' lifecycle event files (JSON Lines) by wall time and filter
them. Monotonic clocks differ between processes, so files are merged by `wall`; events
with equal wall times keep the order of the files on the command line, then their order
within the file. Every line is schema-checked: a bad line is reported on stderr as
FILE:LINE: problem and skipped (--strict makes it fatal, exit 1). Exit status 2 when a
file cannot be read."""


def _run(args: argparse.Namespace) -> int:
    from swactor.events.cli import run

    return run(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swactor events FILE... [--run ID] [--node ID] [--edge ID] [--event NAME]...`."""
    parser = subparsers.add_parser(
        "events",
        help="merge and filter lifecycle event files (JSON Lines) from several processes",
        description=DESCRIPTION,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSON Lines event files")
    parser.add_argument("--run", type=int, metavar="ID", help="only this run_id")
    parser.add_argument("--node", type=int, metavar="ID", help="only this node_id")
    parser.add_argument("--edge", type=int, metavar="ID", help="only this edge_id")
    parser.add_argument("--stage", type=int, metavar="INDEX", help="only this stage_index")
    parser.add_argument("--event", action="append", metavar="NAME",
                        choices=[name.value for name in EventName],
                        help="only this event (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    parser.add_argument("--strict", action="store_true", help="stop at the first bad line")
    parser.set_defaults(handler=_run)
