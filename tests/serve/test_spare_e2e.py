"""A stage node killed mid-stream with a warm spare: the spare takes the stage without
loading weights, and every stream continues identical.

End to end with real parts: `swactor serve --nodes 4 --stages 3 --spares 1` (four real
node processes with tinygrad workers on the real SmolLM2, real QUIC edges; the fourth
node is the spare) and the official `openai` client streaming concurrent greedy
completions. The spare must first answer a preload of every stage's role
(`spare_preloaded` x3); then the healthy server answers the requests once, and again
while the node of stage 1 is killed with SIGKILL. Every stream must complete with
exactly the healthy chunks; the new run must put the spare at stage 1 and keep the
survivors at their stages, and every stage of the new run, the spare's included, must
report `role_reused` (its worker re-armed a role it held: nothing was loaded);
`swactor check` must accept every process's trace. Marked soak: it boots four nodes
(`just soak-tests`).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .fault_rig import PROMPTS, FaultRig, assert_continued
from .streams import events

pytestmark = [pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(1800)]


def stage_nodes(events_dir: Path, run_id: int) -> dict[int, tuple[int, int]]:
    """Stage index -> (node id, pid) of run `run_id`, from the nodes' stage_ready."""
    found: dict[int, tuple[int, int]] = {}
    for path in sorted(events_dir.glob("node-*.jsonl")):
        for event in events(path):
            if event["event"] == "stage_ready" and event.get("run_id") == run_id:
                found[int(event["stage_index"])] = (int(event["node_id"]), int(event["pid"]))
    return found


def stage_ready(events_dir: Path, run_id: int) -> list[dict[str, object]]:
    return [e for path in sorted(events_dir.glob("node-*.jsonl")) for e in events(path)
            if e["event"] == "stage_ready" and e.get("run_id") == run_id]


def test_a_warm_spare_takes_the_lost_stage_without_loading(tmp_path: Path) -> None:
    with FaultRig(tmp_path, "--nodes", "4", "--stages", "3", "--spares", "1",
                  "--retry-delay", "0.5", boot_s=1500) as rig:
        deadline = time.monotonic() + 600
        while sum(e["event"] == "spare_preloaded" for e in rig.events()) < 3:
            assert time.monotonic() < deadline, "the spare did not preload every stage"
            assert not any(e["event"] == "spare_preload_failed" for e in rig.events()), \
                [e for e in rig.events() if e["event"] == "spare_preload_failed"]
            time.sleep(0.2)
        first_run = rig.first_run()
        before = stage_nodes(rig.events_dir, first_run)
        spare = {int(e["detail"]["spare"]) for e in rig.events()
                 if e["event"] == "spare_preloaded"}
        assert len(spare) == 1 and spare.isdisjoint(n for n, _ in before.values())
        preloaded = sorted(int(e["detail"]["stage_index"]) for e in rig.events()
                           if e["event"] == "spare_preloaded")
        assert preloaded == [0, 1, 2]

        healthy = rig.healthy()
        faulted, _ = rig.stream_to_kill()
        killed, pid = before[1]
        os.kill(pid, signal.SIGKILL)
        assert_continued(healthy, faulted)

        seen = rig.events()
        recovered = next(e for e in seen if e["event"] == "serve_recovery_completed")
        new_run = int(recovered["run_id"])
        after_kill = stage_nodes(rig.events_dir, new_run)
        (spare_id,) = spare
        assert after_kill[1][0] == spare_id  # the spare took the lost stage ...
        assert after_kill[0][0] == before[0][0] and after_kill[2][0] == before[2][0]
        assert killed not in {n for n, _ in after_kill.values()}
        ready = stage_ready(rig.events_dir, new_run)
        assert len(ready) == 3 and all(e.get("role_reused") is True for e in ready), ready
        assert "preloaded" in str(recovered["detail"].get("placement"))
        # ... and the first run's stages loaded theirs (the flag is not always true)
        assert all(e.get("role_reused") is False for e in stage_ready(rig.events_dir, first_run))
        migrated = [e for e in seen if e["event"] == "sequence_migrated"]
        assert len(migrated) == len(PROMPTS) and "sequence_lost" not in \
            [e["event"] for e in seen]

        assert rig.stop() == 0, rig.serve.describe()
        rig.check_traces()
