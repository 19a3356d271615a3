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

import time
from pathlib import Path
from typing import Any

import pytest

from swactor.model.paths import default_model_path
from swactor.testing.netns_pool import STAGES, NetnsStreams, ServingPool, events
from tests.multihost.pool import MARKS, assert_run_allowed, finished_run

pytestmark = [*MARKS, pytest.mark.soak, pytest.mark.timeout(1800)]

HOSTS = (*STAGES, "n3")
BOOT_S = 900.0
PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "The three primary colors are")
MAX_TOKENS = 28
CUT_AFTER = 4
"""Chunks every stream has received before the link goes down."""


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


def _run_leases(pool: ServingPool, name: str, report: dict[str, Any],
                run_id: int) -> list[list[int]]:
    """The ring leases in host `name`'s leak check `report` that belong to an edge of
    run `run_id` (its `edge_ready` events). A survivor prints the check 0.2 s after its
    stage finished, and the next run, with nothing to load, may hold new leases by then."""
    edges = {int(e["edge_id"]) for e in events(pool.events_dir / f"{name}.jsonl")
             if e["event"] == "edge_ready" and e.get("run_id") == run_id}
    assert edges, f"{name} has no edge_ready of run {run_id}"
    return [lease for lease in report["live_leases"] if int(lease[0]) in edges]


def test_a_stage_host_cut_off_mid_stream_migrates_every_stream(tmp_path: Path) -> None:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    with ServingPool(tmp_path, HOSTS, subnet_base=200) as pool:
        url = pool.serve([
            "--spares", "1", "--split", "10,10,10", "--max-seq-len", "256", "--slots", "4",
            "--retry-delay", "0.5", "--warm-prompt-tokens", "0", "--warm-batch-rows", "0"],
            BOOT_S)
        log, nodes = pool.log, pool.nodes
        healthy = NetnsStreams(pool.orch, url, MAX_TOKENS, PROMPTS).finish(900)
        assert all(r["error"] is None and len(r["chunks"]) == MAX_TOKENS
                   for r in healthy), healthy
        first_run = int(next(e for e in events(log)
                             if e["event"] == "serve_started")["run_id"])
        first_hosts = pool.stage_hosts(first_run)
        assert sorted(first_hosts) == [0, 1, 2], first_hosts
        cut = first_hosts[1]
        preloaded = _wait_preloaded(log, first_run, BOOT_S)
        spare = nodes[next(iter(set(HOSTS) - set(first_hosts.values())))]
        assert set(preloaded) == {int(spare.wait_for(
            lambda d: d.get("kind") == "available", 1)["node_id"])}, preloaded

        client = NetnsStreams(pool.orch, url, MAX_TOKENS, PROMPTS)
        streamed = client.wait_chunks(CUT_AFTER, 900)
        assert max(streamed) < MAX_TOKENS, "cut too late"
        pool.topology.set_link(cut, up=False)
        cut_wall = time.time_ns()
        faulted = client.finish(900)

        # the cut-off host ends its stage by itself, while it is still cut off
        alone = nodes[cut].wait_for(finished_run(first_run), 120)
        assert alone["live_leases"] == [], alone
        for name in set(first_hosts.values()) - {cut}:
            report = nodes[name].wait_for(finished_run(first_run), 60)
            assert _run_leases(pool, name, report, first_run) == [], (name, report)
        pool.topology.set_link(cut, up=True)
    stopped = pool.stopped
    assert stopped.serve == 0, pool.describe()
    assert stopped.nodes == dict.fromkeys(HOSTS, 0), pool.describe()
    assert stopped.left.keys() == {"orch", *HOSTS} and not any(stopped.left.values()), \
        f"processes left in the namespaces: {stopped.left}"

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
    new_hosts = pool.stage_hosts(new_run)
    assert sorted(new_hosts) == [0, 1, 2], new_hosts
    assert set(new_hosts.values()) == set(HOSTS) - {cut}, new_hosts  # the spare joined
    ready = [e for name in new_hosts.values() for e in events(pool.events_dir / f"{name}.jsonl")
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
    assert_run_allowed(pool.events_dir, first_run)
    assert_run_allowed(pool.events_dir, new_run)
    print(f"\ncut {cut} (stage 1) after {streamed} chunks: run_faulted "
          f"{(fault['wall'] - cut_wall) / 1e9:.2f} s after the cut, new run on "
          f"{sorted(new_hosts.values())} ready "
          f"{(recovered['wall'] - cut_wall) / 1e9:.2f} s after it")
