"""Multi-host link loss: the middle stage host's cable is pulled during decode.

3 stage hosts + 1 orchestrator host in network namespaces (as test_cluster_netns), a
long SmolLM2 run. Once the orchestrator has received a few tokens, the bridge port of
`n1` goes down: no packet crosses between n1 and anyone for the rest of the run.

One module-scoped cluster (booting SmolLM2 three times is the expensive part) serves
both tests, in file order:

- the run must end Faulted with exactly one reason, MembershipLost seen by membership
  (SWIM declares n1 dead before the QUIC idle timeout makes n0 and n2 report their edges'
  StreamFault: `swactor.orchestrator.discovery`, Fault order), the tokens received so
  far kept, and a teardown outcome other than Clean; the orchestrator must exit 1 by
  itself, the two survivors must finish their stage with no active run and no lease,
  and so must the cut-off node, still cut off (it loses its orchestrator's connection
  and stops the run itself instead of waiting forever for a StopRun);
- once the link is back, a second run over the same three nodes must complete: the new
  orchestrator's discovery, joining through n0, must find all 3 nodes available within
  its 120 s. Both sides of the cut declared each other dead, and plain SWIM never
  probes a dead member again; the reconnect sync (`SwimConfig.reconnect_interval_s`,
  bound `heal_bound_s`) re-merges the views (before it, 3 of 4 tries found only 2 of 3
  nodes). The second run's start is printed as seconds after the link came back.

At the end every node must exit 0 on SIGTERM and no process may be left in any
namespace; the namespaces are removed whatever happened.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import NetnsTopology
from swactor.model.paths import default_model_path
from swactor.testing.host_process import HostProcess
from swactor.testing.netns_pool import STAGES, start_node, wait_available
from swactor.transport.identity import NodeIdentity
from tests.multihost.pool import (
    MARKS,
    assert_run_allowed,
    final_report,
    finished_run,
    start_orchestrator,
)

pytestmark = [*MARKS, pytest.mark.timeout(900)]

LONG_TOKENS = 400
LONG_SEQ = 512
TOKENS_BEFORE_CUT = 3
CUT = "n1"
FIRST_TOKENS_S = 600.0
FAULT_S = 300.0
STAGE_END_S = 120.0


@dataclass
class Partitioned:
    """The cluster after run 1 faulted on the pulled link (module doc)."""

    hosts: NetnsTopology
    nodes: dict[str, HostProcess]
    keys: Path
    events: Path
    addresses: dict[int, str]
    exit_code: int
    report: dict[str, Any]
    fault_s: float
    cut_wall_ns: int


def tokens_received(events: Path) -> int:
    """token_received records so far in an orchestrator events file."""
    if not events.is_file():
        return 0
    return sum(1 for line in events.read_text().splitlines()
               if line and json.loads(line)["event"] == "token_received")


def run_faulted_after_s(events: Path, since_wall_ns: int) -> float:
    """Seconds from `since_wall_ns` to the run_faulted record (one kernel clock)."""
    walls: list[int] = [record["wall"] for line in events.read_text().splitlines()
             if line and (record := json.loads(line))["event"] == "run_faulted"]
    assert len(walls) == 1, walls
    return (walls[0] - since_wall_ns) / 1e9


def wait_tokens(orchestrator: HostProcess, events: Path, count: int) -> None:
    deadline = time.monotonic() + FIRST_TOKENS_S
    while tokens_received(events) < count:
        assert orchestrator.process.poll() is None, orchestrator.describe()
        assert time.monotonic() < deadline, f"no {count} tokens: {orchestrator.describe()}"
        time.sleep(0.2)


def assert_stage_ended(node: HostProcess, run: int, timeout_s: float) -> dict[str, Any]:
    report = node.wait_for(finished_run(run), timeout_s)
    assert report["active_run"] is None and report["live_leases"] == [], (node.label, report)
    return report


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Partitioned]:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    netns.sweep_stale()
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{200 + pid % 50}.{(pid + 1) % 250}.0/24")
    tmp = tmp_path_factory.mktemp("link-down")
    keys, events = tmp / "keys", tmp / "events"
    keys.mkdir(mode=0o700)
    events.mkdir()
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    with NetnsTopology(["orch", *STAGES], subnet) as hosts:
        nodes = {name: start_node(hosts, name, keys, events, orchestrator_id)
                 for name in STAGES}
        try:
            addresses = wait_available(list(nodes.values()))
            orchestrator = start_orchestrator(hosts, 1, keys, events, LONG_TOKENS, LONG_SEQ)
            wait_tokens(orchestrator, events / "orchestrator-1.jsonl", TOKENS_BEFORE_CUT)
            hosts.set_link(CUT, up=False)
            cut_at, cut_wall_ns = time.monotonic(), time.time_ns()
            code, report = final_report(orchestrator, FAULT_S)
            yield Partitioned(hosts, nodes, keys, events, addresses, code, report,
                              time.monotonic() - cut_at, cut_wall_ns)
        finally:
            codes = {name: node.stop(30) for name, node in nodes.items()}
        left = {name: hosts.pids(name) for name in hosts.hosts}
    assert codes == dict.fromkeys(STAGES, 0), [n.describe() for n in nodes.values()]
    assert left == {name: [] for name in hosts.hosts}, "processes left in the namespaces"


def test_pulled_link_faults_the_run_and_survivors_end_their_stage(
    partitioned: Partitioned,
) -> None:
    report = partitioned.report
    assert partitioned.exit_code == 1, report
    assert report["outcome"] == "Faulted", report
    assert report["fault"] == {"reason": "MembershipLost", "component": "membership",
                               "stage_index": None}, report
    assert report["teardown"] in ("Faulted", "TimedOut"), report
    assert TOKENS_BEFORE_CUT <= len(report["generated_token_ids"]) < LONG_TOKENS
    assert [s["node_id"] for s in report["stages"]] == sorted(partitioned.addresses)
    for name in STAGES:  # the cut-off node too, while its link is still down
        assert_stage_ended(partitioned.nodes[name], 1, STAGE_END_S)
    assert_run_allowed(partitioned.events, 1)
    faulted_s = run_faulted_after_s(partitioned.events / "orchestrator-1.jsonl",
                                    partitioned.cut_wall_ns)
    print(f"\nrun_faulted {faulted_s:.1f}s after the cut, orchestrator exited "
          f"{partitioned.fault_s:.1f}s after it: fault {report['fault']}, teardown "
          f"{report['teardown']}, {len(report['generated_token_ids'])} tokens")


def test_the_pool_serves_again_once_the_link_is_back(partitioned: Partitioned) -> None:
    hosts, nodes = partitioned.hosts, partitioned.nodes
    hosts.set_link(CUT, up=True)
    restored_at, restored_wall_ns = time.monotonic(), time.time_ns()
    second = start_orchestrator(hosts, 2, partitioned.keys, partitioned.events, 4, 64)
    code, report = final_report(second, FAULT_S)
    ready = [record["wall"] for line in
             (partitioned.events / "orchestrator-2.jsonl").read_text().splitlines()
             if line and (record := json.loads(line))["event"] == "pool_ready"]
    print(f"\nsecond run: pool ready {(ready[0] - restored_wall_ns) / 1e9:.1f}s after the "
          f"link was restored (orchestrator started at once), run ended "
          f"{time.monotonic() - restored_at:.1f}s after it: {report['outcome']}")
    assert code == 0, (report, second.describe())
    assert (report["outcome"], report["teardown"]) == ("Completed", "Clean"), report
    for node in nodes.values():
        assert assert_stage_ended(node, 2, 60)["clean"] is True
    assert_run_allowed(partitioned.events, 2)
