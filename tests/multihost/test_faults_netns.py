"""The network fault sources of spec §36 across network namespaces: real `swactor node`
processes on three stage hosts, the orchestrator on a fourth, SWIM-joined, SmolLM2
split 10,10,10.

One run per case on the same nodes, each armed through the `SWACTOR_FAULT_INJECT` file
(the nodes inherit its path; entries name stage 0's node): stage 0's send pump fails
its QUIC handshake to stage 1's host (EdgeEstablishmentFailed), then resets its edge
stream after the first bytes (StreamFault). Each faulted run must end with exactly
that reason, `Faulted`, every node's stage finished with no lease and no active run,
and then a disarmed run on the same nodes must complete with the same worker on every
node. The link-down case (membership loss) is `test_link_down.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swactor import faults
from swactor.cluster.netns import NetnsTopology
from swactor.model.paths import default_model_path
from swactor.testing.netns_pool import STAGES, start_node, wait_available
from swactor.transport.identity import NodeIdentity
from tests.multihost.pool import (
    MARKS,
    assert_run_allowed,
    final_report,
    finished_run,
    start_orchestrator,
)

pytestmark = [*MARKS, pytest.mark.timeout(1200)]

TOKENS = 4
MAX_SEQ = 32
RUN_S = 600.0
CASES = [
    ("edge establishment failure", {"point": "driver.connect"}, "EdgeEstablishmentFailed"),
    ("stream fault (peer reset)",
     {"point": "driver.send", "after_bytes": 1, "mode": "reset"}, "StreamFault"),
]


def run_once(topology: NetnsTopology, run: int, keys: Path, events: Path) -> dict[str, Any]:
    orchestrator = start_orchestrator(topology, run, keys, events, TOKENS, MAX_SEQ)
    return final_report(orchestrator, RUN_S)[1]


def test_network_faults_end_the_run_once_and_the_pool_serves_again(
    topology: NetnsTopology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    keys, events, armed = tmp_path / "keys", tmp_path / "events", tmp_path / "faults.json"
    keys.mkdir(mode=0o700)
    events.mkdir()
    faults.arm(armed)
    monkeypatch.setenv(faults.ENV_FILE, str(armed))
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    nodes = [start_node(topology, name, keys, events, orchestrator_id) for name in STAGES]
    try:
        addresses = wait_available(nodes)
        stage0 = min(addresses)  # stages are served in node-id order
        run = 0
        for source, entry, reason in CASES:
            run += 1
            faults.arm(armed, {**entry, "node": stage0})
            report = run_once(topology, run, keys, events)
            assert report["outcome"] == "Faulted", (source, report)
            assert report["fault"]["reason"] == reason, (source, report)
            for node in nodes:
                finished = node.wait_for(finished_run(run), 120)
                assert finished["active_run"] is None, (source, node.label, finished)
                assert finished["live_leases"] == [], (source, node.label, finished)
            assert_run_allowed(events, run)
            faults.arm(armed)
            run += 1
            report = run_once(topology, run, keys, events)
            assert (report["outcome"], report["teardown"]) == ("Completed", "Clean"), (
                f"the run after {source}", report, [node.describe() for node in nodes])
            assert len(report["generated_token_ids"]) == TOKENS, report
            for node in nodes:
                finished = node.wait_for(finished_run(run), 120)
                assert finished["clean"] is True and finished["live_leases"] == [], finished
            assert_run_allowed(events, run)
        for node in nodes:
            finished = [d for d in node.documents if d.get("kind") == "stage_finished"]
            assert len(finished) == run, (node.label, finished)
            assert len({d["worker_pid"] for d in finished}) == 1, (node.label, finished)
    finally:
        codes = [node.stop(30) for node in nodes]
    assert codes == [0, 0, 0], [node.describe() for node in nodes]
    for name in topology.hosts:
        assert topology.pids(name) == [], f"processes left in {name}"
