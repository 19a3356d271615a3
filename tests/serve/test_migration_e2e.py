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
import time
from pathlib import Path
from typing import Any

import pytest

from swactor.testing.serve_process import cmdline, descendants

from .fault_rig import MAX_TOKENS, PROMPTS, FaultRig, assert_continued
from .streams import stage_node_pid

pytestmark = [pytest.mark.slow, pytest.mark.soak]


def test_killing_a_stage_node_mid_stream_migrates_every_stream(tmp_path: Path) -> None:
    with FaultRig(tmp_path, "--nodes", "4", "--stages", "3", "--retry-delay", "0.5",
                  "--warm-prompt-tokens", "0") as rig:
        healthy = rig.healthy()
        first_run = rig.first_run()
        found = stage_node_pid(rig.events_dir, 1, first_run)
        assert found is not None
        pid, killed = found
        assert "swactor.cli node" in cmdline(pid) and pid in descendants(rig.serve.process.pid)

        faulted, streamed = rig.stream_to_kill()
        os.kill(pid, signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time_ns()
        assert_continued(healthy, faulted)

        # the longest wait after the kill: the recovery's pause (earlier chunks may have
        # been on their way already)
        pauses = [max(t - max(prev, killed_at) for prev, t in itertools.pairwise(s.times)
                      if t > killed_at) for s in faulted]
        seen = rig.events()
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
        assert fault["reason"] == "MembershipLost"  # the node's exit, not an idle timeout
        assert "serve_recovery_started" in names and "serve_recovery_completed" in names
        recovered = next(e for e in seen if e["event"] == "serve_recovery_completed")
        new_run = int(recovered["run_id"])
        assert new_run != first_run
        survivors = rig.run_nodes(new_run)
        assert len(survivors) == 3 and killed not in survivors
        migrated = [e for e in seen if e["event"] == "sequence_migrated"]
        in_flight = [n for n in streamed if n < MAX_TOKENS]
        assert len(migrated) == len(in_flight) == len(PROMPTS)
        assert {int(e["run_id"]) for e in migrated} == {new_run}
        assert all(e["detail"]["from_run"] == first_run for e in migrated)
        assert "sequence_lost" not in names

        assert rig.stop() == 0, rig.serve.describe()
        rig.check_traces()
