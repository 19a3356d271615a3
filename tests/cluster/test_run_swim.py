"""`swactor run` walks the multi-machine path (slow: real model): its nodes join SWIM on
loopback with the run's pool file and the orchestrator's `pool_readiness` machine, not
the session, reports pool_ready, after every node's node_available and before the plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swactor.cluster.run_cmd import LOCAL_CONVERGENCE_WINDOW_S
from swactor.membership.admission import load_pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_swactor_run_goes_through_pool_readiness(tmp_path: Path) -> None:
    keys, logs = tmp_path / "keys", tmp_path / "events"
    done = subprocess.run(
        [sys.executable, "-m", "swactor.cli", "run", "--nodes", "2", "--prompt", "hi",
         "--max-tokens", "2", "--json", "--keys-dir", str(keys), "--events-dir", str(logs)],
        capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["outcome"] == "Completed"

    pinned = load_pool(keys / "pool.txt")
    assert {s["node_id"] for s in report["stages"]} == pinned.stage_ids
    orchestrator = events(logs / "orchestrator.jsonl")
    ready = [e for e in orchestrator if e["event"] == "pool_ready"]
    assert len(ready) == 1
    assert ready[0]["detail"] == {"candidates": 2, "gate": "pool_readiness",
                                  "convergence_window_s": LOCAL_CONVERGENCE_WINDOW_S}
    assert {ready[0]["node_id"]} == set(pinned.orchestrator_ids)
    planned = next(e for e in orchestrator if e["event"] == "run_planned")
    assert ready[0]["mono"] < planned["mono"]
    for index in range(2):
        node = events(logs / f"node-{index}.jsonl")
        available = next(e for e in node if e["event"] == "node_available")
        assert available["node_id"] in pinned.stage_ids
        assert available["wall"] < ready[0]["wall"]
