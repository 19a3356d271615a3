"""Multi-host (spec §41 layer c): 3 stage hosts + 1 orchestrator host, each its own
Linux network namespace on one bridge, real `swactor node` / `swactor orchestrator`
processes, real QUIC and real SWIM between the namespaces, SmolLM2 split 10,10,10.

The nodes join SWIM through the first node; the orchestrator finds the pool through
the same seed (`--seed --nodes 3`), never being told an address. Two runs on the same
nodes: each must give the greedy tokens of the model package's single StageRole over
all 30 blocks (computed here, in process), end Completed with a clean teardown, be
served by the three nodes in id order from the addresses on the test subnet, and leave
every node idle with no ring lease, the same worker and no extra fd. Each node's model
cache starts empty and the plan names no path (the orchestrator offers its model by
default): run 1 fetches each stage's ranges from the orchestrator (at most 1.05x its
share, printed per node), run 2 fetches nothing. Then SIGTERM:
every node exits 0 by itself, no process is left in any namespace, and every
namespace (with the bridge) is gone afterwards — the teardown runs when the test fails
too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swactor.cluster.netns import NetnsTopology
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.testing.netns_pool import STAGES, start_node, wait_available
from swactor.transport.identity import NodeIdentity
from tests import single_stage
from tests.cluster.event_order import check_run_order, read_records
from tests.multihost.pool import (
    MARKS,
    PROMPT,
    assert_run_allowed,
    final_report,
    finished_run,
    start_orchestrator,
)

pytestmark = [*MARKS, pytest.mark.timeout(1200)]

TOKENS = 16
MAX_SEQ = 64
RUN_S = 600.0


def reference_tokens(path: Path, prompt: tuple[int, ...]) -> list[int]:
    return single_stage.reference_tokens(path, 30, prompt, TOKENS, MAX_SEQ)


def run_orchestrator(hosts: NetnsTopology, run: int, keys: Path, events: Path
                     ) -> dict[str, Any]:
    orchestrator = start_orchestrator(hosts, run, keys, events, TOKENS, MAX_SEQ)
    code, report = final_report(orchestrator, RUN_S)
    assert code == 0, (report, orchestrator.describe())
    return report


def test_two_runs_across_four_namespaces_match_one_stage(
    topology: NetnsTopology, tmp_path: Path
) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    keys, events = tmp_path / "keys", tmp_path / "events"
    keys.mkdir(mode=0o700)
    events.mkdir()
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    nodes = [start_node(topology, name, keys, events, orchestrator_id) for name in STAGES]
    try:
        prompt = tuple(Tokenizer.from_gguf(model).encode(PROMPT))
        expected = reference_tokens(model, prompt)
        addresses = wait_available(nodes)

        facts = []
        for run in (1, 2):
            report = run_orchestrator(topology, run, keys, events)
            assert (report["outcome"], report["teardown"]) == ("Completed", "Clean"), report
            assert report["prompt_token_ids"] == list(prompt)
            assert report["generated_token_ids"] == expected, f"run {run}"
            stages = report["stages"]
            assert [s["node_id"] for s in stages] == sorted(addresses)
            assert [(s["layer_start"], s["layer_end_exclusive"]) for s in stages] == [
                (0, 10), (10, 20), (20, 30)]
            # weights: fetched from the orchestrator into empty caches once, then reused
            assert (report["weights_served_bytes"] > 0) == (run == 1), report
            for node in nodes:
                last = node.wait_for(finished_run(run), 60)
                assert last["clean"] is True, (node.label, last)
                fetched = last["weights_fetched"]
                if run == 1:
                    ratio = fetched["fetched_bytes"] / fetched["share_bytes"]
                    print(f"{node.label}: fetched {fetched['fetched_bytes']} bytes for a "
                          f"{fetched['share_bytes']}-byte share ({ratio:.3f})")
                    assert 0 < ratio <= 1.05, last
                else:
                    assert fetched["fetched_bytes"] == 0, last
                assert last["active_run"] is None and last["live_leases"] == [], last
                assert last["runs_served"] == list(range(1, run + 1)), last
            assert_run_allowed(events, run)
            facts.append([single_stage.process_facts(node.pid) for node in nodes])
        for node in nodes:
            finished = [d for d in node.documents if d.get("kind") == "stage_finished"]
            assert len({d["worker_pid"] for d in finished}) == 1, finished
        for (fds1, kids1), (fds2, kids2) in zip(facts[0], facts[1], strict=True):
            assert kids1 == kids2 and len(kids2) == 1
            assert fds2 <= fds1, (fds1, fds2)
    finally:
        codes = [node.stop(30) for node in nodes]
    assert codes == [0, 0, 0], [node.describe() for node in nodes]
    for name in topology.hosts:
        assert topology.pids(name) == [], f"processes left in {name}"

    records = read_records(sorted(events.glob("*.jsonl")))
    for run in (1, 2):
        assert check_run_order(records, run) == []
