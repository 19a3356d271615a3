"""`swactor check`: replay lifecycle event logs through the protocol tables.

The tables in `fsm/` are data (each generated machine module exports its `MODEL`), and
every lifecycle event of spec §40 is emitted at a known place of one table
(`swactor.check.lifecycle`). `swactor.check.replay` feeds each process's events for each
run, in emission order, through the tables of that process's role and reports the first
event no path of the table allows, the states it saw and a one-line verdict.

What this checks, precisely: for each process and run, that the order of its lifecycle
events is one the tables allow: the orchestrator's run (orchestrator_run), each stage
(stage_controller), each edge end (edge_record), each node's boot (node_boot), with
unseen rows (those that emit nothing) and guards left open. What it does not check:
guards' facts (whether a barrier really had every stage ready), the order between
processes (their reports race over separate connections), events no table position is
claimed for (`lifecycle.UNCHECKED`), machines that emit no lifecycle event (rings,
pumps, the arena, the worker), and payload.
"""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Replay the lifecycle event files (JSON Lines) of a run's processes through the protocol
tables of fsm/ and say, for each process and run, whether the tables allow the order its
events came in: the first event they do not allow, the states the machine went through,
and a one-line verdict. Each process's events are ordered by its monotonic clock (the
order it emitted them); processes are independent (their reports race). Rows that emit
no event may happen unseen and guards are not known, so the check is of order, not of
facts. Exit status: 0 ok, 1 a violation (or, with --complete, a run that did not reach
a terminal state), 2 a file that cannot be read or a line that is not a lifecycle event."""


def _run(args: argparse.Namespace) -> int:
    from swactor.check.command import run

    return run(args)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swactor check FILE... [--json] [--complete] [--run ID]`."""
    parser = subparsers.add_parser(
        "check", help="replay lifecycle event files through the protocol tables",
        description=DESCRIPTION,
    )
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="JSON Lines event files (every process of the run)")
    parser.add_argument("--run", type=int, metavar="ID", help="only this run_id")
    parser.add_argument("--json", action="store_true",
                        help="one JSON document: the verdict and every group's report")
    parser.add_argument("--complete", action="store_true",
                        help="a run that ends before a terminal state fails too")
    parser.set_defaults(handler=_run)
