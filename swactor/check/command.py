"""`swactor check FILE...`: read, replay, print, exit status (see `swactor.check`)."""

from __future__ import annotations

import argparse
import json
import sys

from swactor.check.replay import GroupReport, check, verdict
from swactor.events.cli import Rejected, read_file
from swactor.events.schema import Emitted


def run(args: argparse.Namespace) -> int:
    events: list[Emitted] = []
    bad = 0
    for path in args.files:
        try:
            for _line_no, item in read_file(path):
                if isinstance(item, Rejected):
                    print(f"{item.path}:{item.line_no}: {item.error}", file=sys.stderr)
                    bad += 1
                elif args.run is None or item.value("run_id") == args.run:
                    events.append(item)
        except OSError as error:
            print(f"swactor check: cannot read {path}: {error.strerror or error}",
                  file=sys.stderr)
            return 2
    reports = check(events)
    overall = verdict(reports)
    if args.json:
        json.dump({"verdict": overall, "events": len(events), "bad_lines": bad,
                   "groups": [r.to_json() for r in reports]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        for report in reports:
            print(report.line())
        print(_summary(reports, overall, len(events)))
    if bad:
        return 2
    if overall == "violation" or (overall == "incomplete" and args.complete):
        return 1
    return 0


def _summary(reports: list[GroupReport], overall: str, events: int) -> str:
    counts = {level: sum(r.verdict == level for r in reports)
              for level in ("ok", "incomplete", "violation")}
    return (f"{overall}: {events} events in {len(reports)} process runs "
            f"({counts['ok']} ok, {counts['incomplete']} incomplete, "
            f"{counts['violation']} violations)")
