"""A SWIM-joined pool of `swactor node` processes on the test hosts, and the
orchestrator command that finds it through the same seed.

Stage host `n0` is the SWIM seed: the other nodes and every orchestrator join through
it, so no process is ever told another's QUIC address. Every process is given the same
pool file (`keys/pool.txt`, the pinned public keys of the orchestrator and the three
stage hosts), as an operator would copy it to each machine. Each node trusts the
orchestrator key in `keys/orchestrator.key` and writes its events to
`events/<host>.jsonl`; orchestrator run R writes `events/orchestrator-R.jsonl`.
Each node's model cache is an empty folder of its own (`models/<host>`) and the
orchestrator offers its model (`swactor orchestrator`'s default: no `--offer-model` flag
is given), so a node's weights arrive only as the byte ranges it fetches from the
orchestrator over QUIC, once per node.
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
from swactor.membership.admission import add_member
from swactor.transport.identity import NodeIdentity
from tests.multihost.host_process import HostProcess
from tests.trace_check import assert_tables_allow, read_events

MARKS = [
    pytest.mark.multihost,
    pytest.mark.slow,
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]
STAGES = ("n0", "n1", "n2")
SWIM_PORT = 7946
BOOT_S = 300.0
PROMPT = "hello world"


def seed(hosts: NetnsTopology) -> str:
    return f"{hosts[STAGES[0]].address}:{SWIM_PORT}"


def pool_file(keys: Path, stages: tuple[str, ...] = STAGES) -> Path:
    """`keys/pool.txt`, pinning the orchestrator's and every stage host's key (written once;
    the keys are made on first use, as `swactor pool add` would)."""
    path = keys / "pool.txt"
    if not path.exists():
        add_member(path, NodeIdentity.load_or_create(keys / "orchestrator.key"),
                   "orchestrator", "orch")
        for name in stages:
            add_member(path, NodeIdentity.load_or_create(keys / f"{name}.key"), "node", name)
    return path


def start_node(hosts: NetnsTopology, name: str, keys: Path, events: Path,
               orchestrator: int, stages: tuple[str, ...] = STAGES) -> HostProcess:
    """Stage host `name`'s node; `stages`: every stage host of the pool (the pool file)."""
    host = hosts[name]
    args = ["node", "--key", str(keys / f"{name}.key"), "--bind", host.address,
            "--swim", f"{host.address}:{SWIM_PORT}", "--pool", str(pool_file(keys, stages)),
            "--trust-orchestrator", str(orchestrator), "--arena-ceiling", "256MiB",
            "--event-verbosity", "-1", "--events-file", str(events / f"{name}.jsonl"),
            "--models-dir", str(models_dir(events, name))]
    if name != STAGES[0]:
        args += ["--seed", seed(hosts)]
    return HostProcess(name, hosts[name], args)


def models_dir(events: Path, name: str) -> Path:
    """Host `name`'s own model cache, empty before its node starts."""
    path = events.parent / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_available(nodes: list[HostProcess]) -> dict[int, str]:
    """{node id: address} once every node printed `available` on its own address."""
    addresses = {}
    for node in nodes:
        available = node.wait_for(lambda d: d.get("kind") == "available", BOOT_S)
        assert available["quic"][0] == node.host.address, available
        addresses[int(available["node_id"])] = node.host.address
    return addresses


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
