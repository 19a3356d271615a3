"""Multi-host serving: a stage host's cable is pulled while it serves streams.

Four stage hosts and an orchestrator host in network namespaces on one bridge (as
`test_serve_netns`), found by SWIM through `n0`. `swactor orchestrator --serve
--spares 1` runs 3-stage pipelines (split 10,10,10) over the 4-node pool and keeps the
fourth node as a (warm) spare. The
`openai` client runs inside the orchestrator host's namespace (`tests.serve.streams`
as a module) and streams three greedy completions at once: first on the healthy
pipeline (the reference), then again; once every stream has a few chunks, the bridge
port of the host holding stage 1 goes down. Nothing crosses between that host and
anyone for the rest of the test: no process is killed, the host just falls silent.

What must hold: every stream completes with exactly the reference chunks; the
orchestrator's event log shows the fault (MembershipLost: SWIM declared the host dead,
well before the 30 s QUIC idle timeout), the re-plan on the three survivors (the
spare included, the cut host not) and each stream's migration; before the cut, the
spare reported a role preloaded for every stage (`spare_preloaded`, none failed), and
every stage of the new run reports its role reused (nothing loaded); the cut-off host ends
its stage by itself (its orchestrator's connection is gone) with no ring lease; the
survivors end the first run's stages with no lease. Then the link comes back, SIGTERM
stops the orchestrator (exit 0), every node ends its last stage with no active run and
no lease and exits 0 on SIGTERM, no process is left in any namespace, and the tables
accept every process's trace of both runs (`swactor check`). Soak test: it boots and
loads the model on four hosts (`just soak-tests`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import Host, NetnsTopology
from swactor.model.paths import default_model_path
from swactor.transport.identity import NodeIdentity
from tests.multihost.pool import (
    MARKS,
    STAGES,
    assert_run_allowed,
    finished_run,
    pool_file,
    seed,
    start_node,
    wait_available,
)
from tests.serve.serve_process import ROOT, ServeProcess
from tests.serve.streams import events

pytestmark = [*MARKS, pytest.mark.soak, pytest.mark.timeout(1800)]

HOSTS = (*STAGES, "n3")
HTTP_PORT = 8000
BOOT_S = 900.0
PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "The three primary colors are")
MAX_TOKENS = 28
CUT_AFTER = 4
"""Chunks every stream has received before the link goes down."""


class Client:
    """`python -m tests.serve.streams` inside the orchestrator host: progress and results."""

    def __init__(self, host: Host, url: str) -> None:
        self.process = subprocess.Popen(
            host.argv([sys.executable, "-m", "tests.serve.streams", url, str(MAX_TOKENS),
                       *PROMPTS]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.chunks = [0] * len(PROMPTS)
        self.results: list[dict[str, Any]] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            document = json.loads(line)
            if "results" in document:
                self.results = document["results"]
            else:
                self.chunks[document["stream"]] = document["chunks"]

    def wait_chunks(self, count: int, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while min(self.chunks) < count:
            assert self.process.poll() is None, self.describe()
            assert time.monotonic() < deadline, f"the streams did not start: {self.chunks}"
            time.sleep(0.01)
        return list(self.chunks)

    def finish(self, timeout_s: float) -> list[dict[str, Any]]:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the streams hung: {self.chunks}") from None
        self._reader.join(10)
        assert self.process.returncode == 0 and self.results is not None, self.describe()
        return self.results

    def describe(self) -> str:
        assert self.process.stderr is not None
        return f"client exit {self.process.poll()}: {self.process.stderr.read()[-2000:]}"


def _stage_hosts(events_dir: Path, run_id: int) -> dict[int, str]:
    """{stage index: host name} of run `run_id`, from the nodes' event files."""
    found: dict[int, str] = {}
    for name in HOSTS:
        for event in events(events_dir / f"{name}.jsonl"):
            if event.get("run_id") == run_id and event.get("stage_index") is not None:
                found[int(event["stage_index"])] = name
    return found


def _wait_preloaded(log: Path, run_id: int, timeout_s: float) -> dict[int, list[int]]:
    """{spare node id: stage indices} once the spare preloaded a role for every stage of
    run `run_id` (`spare_preloaded` in the orchestrator's log); fails on a
    `spare_preload_failed` or when the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = [e for e in events(log) if e.get("run_id") == run_id]
        failed = [e["detail"] for e in seen if e["event"] == "spare_preload_failed"]
        assert not failed, failed
        done: dict[int, list[int]] = {}
        for e in seen:
            if e["event"] == "spare_preloaded":
                done.setdefault(int(e["detail"]["spare"]), []).append(
                    int(e["detail"]["stage_index"]))
        if sorted(i for stages in done.values() for i in stages) == [0, 1, 2]:
            return done
        assert time.monotonic() < deadline, f"the spare preloaded only {done}"
        time.sleep(0.2)


def _run_leases(events_dir: Path, name: str, report: dict[str, Any],
                run_id: int) -> list[list[int]]:
    """The ring leases in host `name`'s leak check `report` that belong to an edge of
    run `run_id` (its `edge_ready` events). A survivor prints the check 0.2 s after its
    stage finished, and the next run, with nothing to load, may hold new leases by then."""
    edges = {int(e["edge_id"]) for e in events(events_dir / f"{name}.jsonl")
             if e["event"] == "edge_ready" and e.get("run_id") == run_id}
    assert edges, f"{name} has no edge_ready of run {run_id}"
    return [lease for lease in report["live_leases"] if int(lease[0]) in edges]


def test_a_stage_host_cut_off_mid_stream_migrates_every_stream(tmp_path: Path) -> None:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    netns.sweep_stale()
    pid = os.getpid()
    subnet = ipaddress.IPv4Network(f"10.{200 + pid % 50}.{(pid + 2) % 250}.0/24")
    keys, events_dir = tmp_path / "keys", tmp_path / "events"
    keys.mkdir(mode=0o700)
    events_dir.mkdir()
    orchestrator_id = NodeIdentity.load_or_create(keys / "orchestrator.key").node_id
    log = events_dir / "orchestrator.jsonl"
    with NetnsTopology(["orch", *HOSTS], subnet) as hosts:
        nodes = {name: start_node(hosts, name, keys, events_dir, orchestrator_id, HOSTS)
                 for name in HOSTS}
        orch = hosts["orch"]
        serve: ServeProcess | None = None
        node_codes: dict[str, int | None] = {}
        try:
            wait_available(list(nodes.values()))
            serve = ServeProcess([
                "orchestrator", "--key", str(keys / "orchestrator.key"),
                "--bind", orch.address, "--seed", seed(hosts), "--nodes", str(len(HOSTS)),
                "--spares", "1", "--pool", str(pool_file(keys, HOSTS)),
                "--split", "10,10,10", "--max-seq-len", "256",
                "--serve", f"{orch.address}:{HTTP_PORT}", "--slots", "4",
                "--retry-delay", "0.5", "--warm-prompt-tokens", "0", "--warm-batch-rows", "0",
                "--event-verbosity", "-1",
                "--events-file", str(log)], prefix=orch.argv([]))
            url = serve.wait_url(BOOT_S)
            healthy = Client(orch, url).finish(900)
            assert all(r["error"] is None and len(r["chunks"]) == MAX_TOKENS
                       for r in healthy), healthy
            first_run = int(next(e for e in events(log)
                                 if e["event"] == "serve_started")["run_id"])
            first_hosts = _stage_hosts(events_dir, first_run)
            assert sorted(first_hosts) == [0, 1, 2], first_hosts
            cut = first_hosts[1]
            preloaded = _wait_preloaded(log, first_run, BOOT_S)
            spare = nodes[next(iter(set(HOSTS) - set(first_hosts.values())))]
            assert set(preloaded) == {int(spare.wait_for(
                lambda d: d.get("kind") == "available", 1)["node_id"])}, preloaded

            client = Client(orch, url)
            streamed = client.wait_chunks(CUT_AFTER, 900)
            assert max(streamed) < MAX_TOKENS, "cut too late"
            hosts.set_link(cut, up=False)
            cut_wall = time.time_ns()
            faulted = client.finish(900)

            # the cut-off host ends its stage by itself, while it is still cut off
            alone = nodes[cut].wait_for(finished_run(first_run), 120)
            assert alone["live_leases"] == [], alone
            for name in set(first_hosts.values()) - {cut}:
                report = nodes[name].wait_for(finished_run(first_run), 60)
                assert _run_leases(events_dir, name, report, first_run) == [], (name, report)
            hosts.set_link(cut, up=True)
        finally:
            code = serve.stop() if serve is not None else 0
            node_codes = {name: node.stop(30) for name, node in nodes.items()}
        left = {name: hosts.pids(name) for name in hosts.hosts}
    assert code == 0, serve.describe()
    assert node_codes == dict.fromkeys(HOSTS, 0), [n.describe() for n in nodes.values()]
    assert left == {name: [] for name in hosts.hosts}, "processes left in the namespaces"

    for before, after in zip(healthy, faulted, strict=True):
        assert after["error"] is None, after
        assert after["chunks"] == before["chunks"], (after["prompt"], before, after)
        assert after["finish"] == before["finish"] == "length"
    seen = events(log)
    names = [e["event"] for e in seen]

    def after_cut(name: str) -> dict[str, Any]:
        return next(e for e in seen if e["event"] == name and e["wall"] > cut_wall)

    fault = after_cut("run_faulted")
    assert int(fault["run_id"]) == first_run
    assert fault["reason"] == "MembershipLost", fault  # SWIM, not the QUIC idle timeout
    assert names.count("serve_recovery_started") == 1
    recovered = after_cut("serve_recovery_completed")
    new_run = int(recovered["run_id"])
    new_hosts = _stage_hosts(events_dir, new_run)
    assert sorted(new_hosts) == [0, 1, 2], new_hosts
    assert set(new_hosts.values()) == set(HOSTS) - {cut}, new_hosts  # the spare joined
    ready = [e for name in new_hosts.values() for e in events(events_dir / f"{name}.jsonl")
             if e["event"] == "stage_ready" and e.get("run_id") == new_run]
    assert len(ready) == 3 and all(e.get("role_reused") for e in ready), ready  # none loaded
    migrated = [e for e in seen if e["event"] == "sequence_migrated"]
    assert len(migrated) == len(PROMPTS)
    assert {int(e["run_id"]) for e in migrated} == {new_run}
    assert all(e["detail"]["from_run"] == first_run for e in migrated)
    assert "sequence_lost" not in names
    for name in new_hosts.values():  # the last run's stages ended with the server
        report = nodes[name].wait_for(finished_run(new_run), 1)
        assert report["active_run"] is None and report["live_leases"] == [], (name, report)
    assert_run_allowed(events_dir, first_run)
    assert_run_allowed(events_dir, new_run)
    print(f"\ncut {cut} (stage 1) after {streamed} chunks: run_faulted "
          f"{(fault['wall'] - cut_wall) / 1e9:.2f} s after the cut, new run on "
          f"{sorted(new_hosts.values())} ready "
          f"{(recovered['wall'] - cut_wall) / 1e9:.2f} s after it")
