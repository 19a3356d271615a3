"""The stage host remembers a bounded number of finished runs (a node lives for many).

Unit test of `StageHostState` alone: outcomes appended as the host does at each run's
end; the oldest fall off beyond `HISTORY_KEPT`, while `retired_runs` (the authority
record that a run id is never served twice) keeps every id.
"""

from __future__ import annotations

import pytest

from swactor.node import stage_host
from swactor.node.stage_host import StageHostState
from swactor.node.stage_ports import StageOutcome
from swactor.wire import RunId


def test_history_keeps_the_latest_outcomes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage_host, "HISTORY_KEPT", 3)
    state = StageHostState()
    for run in range(1, 8):
        state.history.append(StageOutcome(run_id=RunId(run), stopped=True))
        state.retired_runs.add(RunId(run))
    assert [int(o.run_id or 0) for o in state.history] == [5, 6, 7]
    assert state.retired_runs == {RunId(run) for run in range(1, 8)}
