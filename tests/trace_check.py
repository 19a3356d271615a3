"""The shared lifecycle trace check every end-to-end, fault-matrix and multi-host run gets.

`assert_tables_allow(events)` replays the events (any processes, any runs) through the
protocol tables (`swactor check`, `swactor.check.replay`) and fails with each offending
group's one-line verdict: a binding that drifts from its table fails the test that ran it.
With `complete` (the default) every replayed machine must also be able to reach a
terminal state, i.e. every run was seen to its end (run_torn_down, stage_stopped).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from swactor.check.replay import GroupReport, check
from swactor.events.cli import Rejected, read_file
from swactor.events.schema import Emitted


def assert_tables_allow(events: Iterable[Emitted], *, complete: bool = True
                        ) -> list[GroupReport]:
    reports = check(events)
    bad = [r.line() for r in reports
           if r.verdict == "violation" or (complete and r.verdict == "incomplete")]
    assert not bad, "the tables do not allow these logs:\n" + "\n".join(bad)
    assert any(r.trackers for r in reports), "no event was replayed"
    return reports


def read_events(*paths: Path, run_id: int | None = None) -> list[Emitted]:
    """Every schema-valid event of the files (a bad line fails), optionally one run's."""
    found: list[Emitted] = []
    for path in paths:
        for line_no, item in read_file(str(path)):
            assert not isinstance(item, Rejected), f"{path}:{line_no}: {item.error}"
            if run_id is None or item.value("run_id") == run_id:
                found.append(item)
    return found
