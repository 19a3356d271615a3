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
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from .serve_process import ServeProcess, cmdline
from .streams import events, join, run_ids, stage_node_pid, stream_all, wait_chunks

pytestmark = [pytest.mark.slow, pytest.mark.soak]

PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "The three primary colors are")
KILL_AFTER = 4
"""Chunks every stream has received before the first node is killed."""


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


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


def _check_traces(events_dir: Path) -> None:
    check = subprocess.run(  # every process's trace is one its tables allow
        [sys.executable, "-m", "swactor.cli", "check",
         *map(str, sorted(events_dir.glob("*.jsonl")))],
        capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 0 and " 0 violations" in check.stdout, check.stdout[-2000:]


def _stage_nodes(events_dir: Path, run_id: int) -> set[int]:
    return {int(e["node_id"]) for path in events_dir.glob("node-*.jsonl")
            for e in events(path) if e.get("run_id") == run_id
            and e.get("stage_index") is not None}


def test_a_second_fault_during_recovery_still_migrates_every_stream(tmp_path: Path) -> None:
    events_dir = tmp_path / "events"
    max_tokens = 24
    serve = ServeProcess(["serve", "--nodes", "4", "--stages", "2", "--port", "0",
                          "--slots", "4", "--retry-delay", "0.5", "--max-restarts", "3",
                          "--warm-prompt-tokens", "0", "--events-dir", str(events_dir)])
    try:
        url = serve.wait_url(600)
        client = _client(url)
        healthy = stream_all(client, PROMPTS, max_tokens)
        join(healthy, 600)
        assert all(len(s.chunks) == max_tokens for s in healthy), [s.chunks for s in healthy]
        log = events_dir / "orchestrator.jsonl"
        first_run = int(next(e for e in events(log) if e["event"] == "serve_started")["run_id"])
        found = stage_node_pid(events_dir, 1, first_run)
        assert found is not None
        first_pid, first_node = found

        faulted = stream_all(client, PROMPTS, max_tokens)
        streamed = wait_chunks(faulted, KILL_AFTER, 600)
        assert max(streamed) < max_tokens, "killed too late"
        known = run_ids(events_dir)
        os.kill(first_pid, signal.SIGKILL)
        # the second fault: a node of the run the recovery is provisioning, while it loads
        deadline = time.monotonic() + 300
        second: tuple[int, int] | None = None
        while second is None:
            assert time.monotonic() < deadline, "no new run was provisioned"
            new = run_ids(events_dir) - known
            second = stage_node_pid(events_dir, 0, min(new)) if new else None
            time.sleep(0.02)
        second_run = min(run_ids(events_dir) - known)
        second_pid, second_node = second
        os.kill(second_pid, signal.SIGKILL)
        second_wall = time.time_ns()
        join(faulted, 600)

        for before, after in zip(healthy, faulted, strict=True):
            assert after.chunks == before.chunks, (after.prompt, before.chunks, after.chunks)
            assert after.finish == before.finish == "length"
        seen = events(log)
        names = [e["event"] for e in seen]
        assert names.count("serve_recovery_started") == 1, names
        (completed,) = [e for e in seen if e["event"] == "serve_recovery_completed"]
        assert completed["wall"] > second_wall, "the second kill came after the recovery"
        new_run = int(completed["run_id"])
        assert new_run not in (first_run, second_run)
        assert _stage_nodes(events_dir, new_run).isdisjoint({first_node, second_node})
        assert len(_stage_nodes(events_dir, new_run)) == 2
        migrated = [e for e in seen if e["event"] == "sequence_migrated"]
        assert len(migrated) == len(PROMPTS)
        assert {int(e["run_id"]) for e in migrated} == {new_run}
        assert all(e["detail"]["from_run"] == first_run for e in migrated)
        assert "sequence_lost" not in names and "serve_failed" not in names
        print(f"\nkilled stage 1 of run {first_run} after {streamed} chunks, then stage 0 "
              f"of run {second_run} while it loaded; every stream continued on run {new_run}")

        # no slot kept: as many sequences as there are slots are served at once again
        again = stream_all(client, (*PROMPTS, "Water boils at"), 6)
        join(again, 600)
        assert all(s.finish == "length" for s in again)
        status, metrics = _get(url, "/metrics")
        assert status == 200
        gauges = ("swactor_serve_sequences_in_flight ", "swactor_serve_requests_queued ")
        in_flight = [line for line in metrics.splitlines() if line.startswith(gauges)]
        assert in_flight and all(float(line.split()[-1]) == 0 for line in in_flight), in_flight
    finally:
        code = serve.stop()
    assert code == 0, serve.describe()
    assert _swactor_alive(_node_pids(events_dir)) == [], "node processes left"
    _check_traces(events_dir)


def test_a_pool_too_small_to_re_plan_ends_every_stream_with_the_reason(
        tmp_path: Path) -> None:
    events_dir = tmp_path / "events"
    max_tokens = 200
    serve = ServeProcess(["serve", "--nodes", "2", "--split", "15,15", "--port", "0",
                          "--slots", "4", "--retry-delay", "2", "--max-restarts", "2",
                          "--warm-prompt-tokens", "0", "--events-dir", str(events_dir)])
    try:
        url = serve.wait_url(600)
        client = _client(url)
        log = events_dir / "orchestrator.jsonl"
        first_run = int(next(e for e in events(log) if e["event"] == "serve_started")["run_id"])
        found = stage_node_pid(events_dir, 1, first_run)
        assert found is not None
        streams = stream_all(client, PROMPTS, max_tokens)
        streamed = wait_chunks(streams, KILL_AFTER, 600)
        os.kill(found[0], signal.SIGKILL)

        # a request sent while the session recovers is held, then refused with the reason
        deadline = time.monotonic() + 120
        while (health := _get(url, "/health"))[0] == 200:
            assert time.monotonic() < deadline, "the session never left Serving"
            time.sleep(0.1)
        assert health[0] == 503 and json.loads(health[1])["state"] == "Recovering", health
        late: list[BaseException] = []

        def ask() -> None:
            try:
                client.completions.create(model="swactor", prompt="Hi", max_tokens=4)
            except BaseException as error:
                late.append(error)

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        join(streams, 300, errors=True)
        asker.join(300)
        assert not asker.is_alive(), "the request sent during the recovery hung"
        code = serve.process.wait(120)
    finally:
        serve.stop()
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
    assert code == 1, serve.describe()  # the session gave up: the documented exit status
    assert why in serve.stderr[-1], serve.stderr[-5:]
    seen = events(log)
    names = [e["event"] for e in seen]
    assert names.count("serve_recovery_started") == 1 and names.count("serve_failed") == 1
    lost = [e for e in seen if e["event"] == "sequence_lost"]
    assert len(lost) == len(PROMPTS) and all(why in e["detail"]["why"] for e in lost)
    print(f"\nkilled stage 1 after {streamed} chunks: {len(lost)} streams ended with "
          f"{refused.message!r}; the late request got 503")
    assert _swactor_alive(_node_pids(events_dir)) == [], "node processes left"
    _check_traces(events_dir)
