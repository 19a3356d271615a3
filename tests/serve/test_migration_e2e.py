"""A stage node killed mid-stream: every in-flight stream continues on a re-planned run.

End to end with real parts: `swactor serve --nodes 4 --stages 3` (four real node
processes with tinygrad workers on the real SmolLM2, real QUIC edges, one spare node)
and the official `openai` client streaming concurrent greedy completions. The same
requests are first answered by the healthy server; then, while they stream again, the
node of stage 1 is killed with SIGKILL (the orchestrator is not touched). Every stream
must complete with exactly the healthy chunks (no duplicated, no missing token: one
chunk per token), and the orchestrator's event log must show the fault, the recovery on
the three survivors (the spare included, the dead node not) and each stream's
migration, and `swactor check` must accept every process's trace. The pause each
stream saw (kill to its next chunk) is printed.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from .serve_process import ServeProcess, cmdline, descendants
from .streams import events, join, stage_node_pid, stream_all, wait_chunks

pytestmark = [pytest.mark.slow, pytest.mark.soak]

PROMPTS = ("The capital of France is", "Once upon a time, in a small village,",
           "The three primary colors are")
MAX_TOKENS = 28
KILL_AFTER = 4
"""Chunks every stream has received before the stage node is killed."""


def test_killing_a_stage_node_mid_stream_migrates_every_stream(tmp_path: Path) -> None:
    events_dir = tmp_path / "events"
    serve = ServeProcess(["serve", "--nodes", "4", "--stages", "3", "--port", "0",
                          "--slots", "4", "--retry-delay", "0.5", "--warm-prompt-tokens", "0",
                          "--events-dir", str(events_dir)])
    try:
        url = serve.wait_url(600)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        healthy = stream_all(client, PROMPTS, MAX_TOKENS)
        join(healthy, 600)
        assert all(len(s.chunks) == MAX_TOKENS for s in healthy), [s.chunks for s in healthy]

        log = events_dir / "orchestrator.jsonl"
        started = [e for e in events(log) if e["event"] == "serve_started"]
        first_run = int(started[0]["run_id"])
        found = stage_node_pid(events_dir, 1, first_run)
        assert found is not None
        pid, killed = found
        assert "swactor.cli node" in cmdline(pid) and pid in descendants(serve.process.pid)

        faulted = stream_all(client, PROMPTS, MAX_TOKENS)
        streamed = wait_chunks(faulted, KILL_AFTER, 600)
        assert max(streamed) < MAX_TOKENS, "killed too late"
        os.kill(pid, signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time_ns()
        join(faulted, 600)

        for before, after in zip(healthy, faulted, strict=True):
            assert after.chunks == before.chunks, (after.prompt, before.chunks, after.chunks)
            assert after.finish == before.finish == "length"
        # the longest wait after the kill: the recovery's pause (earlier chunks may have
        # been on their way already)
        pauses = [max(t - max(prev, killed_at) for prev, t in itertools.pairwise(s.times)
                      if t > killed_at) for s in faulted]
        seen = events(log)
        names = [e["event"] for e in seen]

        def after_kill(name: str) -> tuple[float, dict[str, Any]]:
            event = next(e for e in seen if e["event"] == name and e["wall"] > killed_wall)
            return float(event["wall"] - killed_wall) / 1e9, event

        detected, fault = after_kill("run_faulted")
        print(f"\nkilled stage 1 after {streamed} chunks; from the kill: run_faulted "
              f"{detected:.2f} s ({fault.get('reason')}), run_torn_down "
              f"{after_kill('run_torn_down')[0]:.2f} s, new run ready "
              f"{after_kill('serve_recovery_completed')[0]:.2f} s, next chunk per stream "
              + ", ".join(f"{p:.2f} s" for p in pauses))
        assert fault["reason"] == "MembershipLost"  # SWIM told the run, not an idle timeout
        assert "serve_recovery_started" in names and "serve_recovery_completed" in names
        recovered = next(e for e in seen if e["event"] == "serve_recovery_completed")
        new_run = int(recovered["run_id"])
        assert new_run != first_run
        survivors = {int(e["node_id"]) for path in events_dir.glob("node-*.jsonl")
                     for e in events(path) if e.get("run_id") == new_run
                     and e.get("stage_index") is not None}
        assert len(survivors) == 3 and killed not in survivors
        migrated = [e for e in seen if e["event"] == "sequence_migrated"]
        in_flight = [n for n in streamed if n < MAX_TOKENS]
        assert len(migrated) == len(in_flight) == len(PROMPTS)
        assert {int(e["run_id"]) for e in migrated} == {new_run}
        assert all(e["detail"]["from_run"] == first_run for e in migrated)
        assert "sequence_lost" not in names

        assert serve.stop() == 0, serve.describe()
        check = subprocess.run(  # every process's trace is one its tables allow
            [sys.executable, "-m", "swactor.cli", "check",
             *map(str, sorted(events_dir.glob("*.jsonl")))],
            capture_output=True, text=True, timeout=300, check=False)
        assert check.returncode == 0 and " 0 violations" in check.stdout, check.stdout[-2000:]
    finally:
        assert serve.stop() == 0, serve.describe()
