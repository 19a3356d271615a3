"""Faults while serving that a re-plan cannot simply absorb: two in a row, and a pool too
small to re-plan.

End to end with real parts: `swactor serve` (real node processes with tinygrad workers
on the real SmolLM2, real QUIC edges) driven by the official `openai` client, nodes
killed with SIGKILL (the orchestrator is never touched). Soak tests (`just soak-tests`):
each boots a pool and loads the model more than once.

- Two faults in a row (4 nodes, 2 stages): the node of stage 1 is killed mid-stream;
  while the session provisions the new run on the survivors, a node of that new run is
  killed too. The recovery's first attempt fails, its next attempt runs on the two nodes
  left, and every stream still completes with exactly the healthy chunks. One recovery
  (one `serve_recovery_started`, one `serve_recovery_completed`, after the second kill),
  each stream migrated once, no sequence lost; then a full set of requests is served
  (no slot kept), `/metrics` shows nothing in flight, SIGTERM exits 0, no node process
  is left, and `swactor check` accepts every trace.
- A pool too small (2 nodes, the split fixed at 2 stages): the node of stage 1 is
  killed mid-stream; no plan fits the one survivor. Every in-flight stream ends with an
  error naming the fault and why it did not move (the planner's reason); a request sent
  while the session recovers is held and then answered 503 `unavailable` naming the
  reason (the server, not the request, cannot serve: `swactor.serve.server`); the
  session gives up after `--max-restarts` attempts and the process exits 1 by itself
  with that reason (the documented status of a session that gave up), leaving no node
  process; `swactor check` accepts every trace.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from swactor.testing.serve_process import cmdline

from .fault_rig import KILL_AFTER, PROMPTS, FaultRig, assert_continued
from .streams import events, join, run_ids, stage_node_pid, stream_all

pytestmark = [pytest.mark.slow, pytest.mark.soak]


def _get(url: str, path: str) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _node_pids(events_dir: Path) -> set[int]:
    return {int(e["pid"]) for path in events_dir.glob("node-*.jsonl")
            for e in events(path) if "pid" in e}


def _swactor_alive(pids: set[int]) -> list[int]:
    return sorted(pid for pid in pids if "swactor" in cmdline(pid))


def test_a_second_fault_during_recovery_still_migrates_every_stream(tmp_path: Path) -> None:
    max_tokens = 24
    with FaultRig(tmp_path, "--nodes", "4", "--stages", "2", "--retry-delay", "0.5",
                  "--max-restarts", "3", "--warm-prompt-tokens", "0") as rig:
        healthy = rig.healthy(max_tokens)
        first_run = rig.first_run()
        found = stage_node_pid(rig.events_dir, 1, first_run)
        assert found is not None
        first_pid, first_node = found

        faulted, streamed = rig.stream_to_kill(max_tokens)
        known = run_ids(rig.events_dir)
        os.kill(first_pid, signal.SIGKILL)
        # the second fault: a node of the run the recovery is provisioning, while it loads
        deadline = time.monotonic() + 300
        second: tuple[int, int] | None = None
        while second is None:
            assert time.monotonic() < deadline, "no new run was provisioned"
            new = run_ids(rig.events_dir) - known
            second = stage_node_pid(rig.events_dir, 0, min(new)) if new else None
            time.sleep(0.02)
        second_run = min(run_ids(rig.events_dir) - known)
        second_pid, second_node = second
        os.kill(second_pid, signal.SIGKILL)
        second_wall = time.time_ns()
        assert_continued(healthy, faulted)

        seen = rig.events()
        names = [e["event"] for e in seen]
        assert names.count("serve_recovery_started") == 1, names
        (completed,) = [e for e in seen if e["event"] == "serve_recovery_completed"]
        assert completed["wall"] > second_wall, "the second kill came after the recovery"
        new_run = int(completed["run_id"])
        assert new_run not in (first_run, second_run)
        assert rig.run_nodes(new_run).isdisjoint({first_node, second_node})
        assert len(rig.run_nodes(new_run)) == 2
        migrated = [e for e in seen if e["event"] == "sequence_migrated"]
        assert len(migrated) == len(PROMPTS)
        assert {int(e["run_id"]) for e in migrated} == {new_run}
        assert all(e["detail"]["from_run"] == first_run for e in migrated)
        assert "sequence_lost" not in names and "serve_failed" not in names
        print(f"\nkilled stage 1 of run {first_run} after {streamed} chunks, then stage 0 "
              f"of run {second_run} while it loaded; every stream continued on run {new_run}")

        # no slot kept: as many sequences as there are slots are served at once again
        again = stream_all(rig.client, (*PROMPTS, "Water boils at"), 6)
        join(again, 600)
        assert all(s.finish == "length" for s in again)
        status, metrics = _get(rig.url, "/metrics")
        assert status == 200
        gauges = ("swactor_serve_sequences_in_flight ", "swactor_serve_requests_queued ")
        in_flight = [line for line in metrics.splitlines() if line.startswith(gauges)]
        assert in_flight and all(float(line.split()[-1]) == 0 for line in in_flight), in_flight
        code = rig.stop()
    assert code == 0, rig.serve.describe()
    assert _swactor_alive(_node_pids(rig.events_dir)) == [], "node processes left"
    rig.check_traces()


def test_a_pool_too_small_to_re_plan_ends_every_stream_with_the_reason(
        tmp_path: Path) -> None:
    max_tokens = 200
    with FaultRig(tmp_path, "--nodes", "2", "--split", "15,15", "--retry-delay", "2",
                  "--max-restarts", "2", "--warm-prompt-tokens", "0") as rig:
        found = stage_node_pid(rig.events_dir, 1, rig.first_run())
        assert found is not None
        streams, streamed = rig.stream_to_kill(max_tokens)
        os.kill(found[0], signal.SIGKILL)

        # a request sent while the session recovers is held, then refused with the reason
        deadline = time.monotonic() + 120
        while (health := _get(rig.url, "/health"))[0] == 200:
            assert time.monotonic() < deadline, "the session never left Serving"
            time.sleep(0.1)
        assert health[0] == 503 and json.loads(health[1])["state"] == "Recovering", health
        late: list[BaseException] = []

        def ask() -> None:
            try:
                rig.client.completions.create(model="swactor", prompt="Hi", max_tokens=4)
            except BaseException as error:
                late.append(error)

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        join(streams, 300, errors=True)
        asker.join(300)
        assert not asker.is_alive(), "the request sent during the recovery hung"
        code = rig.serve.process.wait(120)
    why = "the split has 2 stages but the pool has 1 node"
    for stream in streams:
        assert isinstance(stream.error, openai.APIError), (stream.prompt, stream.error)
        assert "not migrated" in stream.error.message and why in stream.error.message, (
            stream.error.message)
        assert KILL_AFTER <= len(stream.chunks) < max_tokens and stream.finish is None
    (refused,) = late
    assert isinstance(refused, openai.APIStatusError) and refused.status_code == 503, refused
    error = json.loads(refused.response.content)["error"]
    assert error["code"] == "unavailable" and why in error["message"], error
    assert code == 1, rig.serve.describe()  # the session gave up: the documented exit status
    assert why in rig.serve.stderr[-1], rig.serve.stderr[-5:]
    seen = rig.events()
    names = [e["event"] for e in seen]
    assert names.count("serve_recovery_started") == 1 and names.count("serve_failed") == 1
    lost = [e for e in seen if e["event"] == "sequence_lost"]
    assert len(lost) == len(PROMPTS) and all(why in e["detail"]["why"] for e in lost)
    print(f"\nkilled stage 1 after {streamed} chunks: {len(lost)} streams ended with "
          f"{refused.message!r}; the late request got 503")
    assert _swactor_alive(_node_pids(rig.events_dir)) == [], "node processes left"
    rig.check_traces()
