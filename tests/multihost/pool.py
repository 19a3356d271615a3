"""The multi-host tests' marks, the orchestrator of one run on the pool of
`swactor.testing.netns_pool` (stage hosts n0, n1, n2, SWIM seed n0, one pool file),
and the checks on what a run left behind.

Orchestrator run R writes `events/orchestrator-R.jsonl`.
`assert_run_allowed(events, R)` replays every process's events of run R through the
protocol tables (`swactor check`); each test calls it once a run has ended everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import NetnsTopology
from swactor.testing.host_process import HostProcess
from swactor.testing.netns_pool import STAGES, pool_file, seed
from tests.trace_check import assert_tables_allow, read_events

MARKS = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]
PROMPT = "hello world"


def start_orchestrator(hosts: NetnsTopology, run: int, keys: Path, events: Path,
                       tokens: int, max_seq: int) -> HostProcess:
    host = hosts["orch"]
    return HostProcess(f"orchestrator run {run}", host, [
        "orchestrator", "--key", str(keys / "orchestrator.key"), "--bind", host.address,
        "--seed", seed(hosts), "--nodes", str(len(STAGES)), "--pool", str(pool_file(keys)),
        "--prompt", PROMPT, "--max-tokens", str(tokens), "--max-seq-len", str(max_seq),
        "--split", "10,10,10", "--json", "--run-id", str(run),
        "--event-verbosity", "-1", "--events-file", str(events / f"orchestrator-{run}.jsonl")])


def assert_run_allowed(events: Path, run: int) -> None:
    """Every process's events of `run` (all files under `events`): an order the tables
    allow, each machine at its end (`tests.trace_check`)."""
    assert_tables_allow(read_events(*sorted(events.glob("*.jsonl")), run_id=run))


def finished_run(run: int) -> Callable[[dict[str, Any]], bool]:
    """Matches a node's stage_finished report of `run`."""
    return lambda d: d.get("kind") == "stage_finished" and d.get("run_id") == run


def final_report(orchestrator: HostProcess, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """Wait for the orchestrator to exit (stopping it after `timeout_s`): its exit code
    and its last JSON document, the run report."""
    try:
        code = orchestrator.finish(timeout_s)
    finally:
        orchestrator.stop(10)
    assert orchestrator.documents, orchestrator.describe()
    return code, orchestrator.documents[-1]
