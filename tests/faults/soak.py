"""`python -m tests.faults.soak [RUNS]` (`just soak`): many runs on one 3-node cluster.

Theory of operation. One `FaultRig` cluster (tiny GGUF) serves RUNS consecutive runs
(default 50); every fifth run has a fault injected (rotating through step failure,
malformed header, missing weights, device OOM, kill -9 of a worker, pump failure, ring
fault, device copy failure, arena pressure timeout). Before the first
run (after a warm-up run, which compiles the kernels) and after the last, each node
process and its worker are measured: open fds, threads, resident memory, and the node's
live ring leases (SIGUSR1 leak check). The last measurement follows one more clean run
(a settle run; up to `SETTLE_TRIES`, as the first runs after a worker's kill -9 may be
refused while it restarts), so a restarting worker is not measured mid-spawn.
The two tables print side by side with the difference.

Each node is also asked for its leases right after every run's session returned (the
orchestrator's run_torn_down is written by then): a stage releases its leases before it
reports StageStopped (spec §38), so any lease seen then was released late or never. A
lease still held after the settle wait of the next clean run is a leak.

Exit status 1 when a clean run did not complete, a fault run did not fault, or a lease
is held at run_torn_down or left; growth in fds/threads/RSS is printed, not judged
(noise on a shared host is large; read the numbers).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.faults.rig import WARM_UP, FaultRig, children

FAULTS: list[tuple[str, dict[str, Any], int]] = [
    ("step failure", {"point": "worker.step", "sequence": 1, "mode": "raise"}, 1),
    ("malformed header", {"point": "worker.egress_header", "sequence": 1, "mode": "garble"}, 0),
    ("weights 404", {"point": "node.weights_path", "path": "/nonexistent/tiny.gguf"}, 1),
    ("device OOM", {"point": "worker.alloc_cap", "bytes": 64}, 1),
    ("worker kill -9", {"point": "worker.step", "sequence": 1, "mode": "kill"}, 2),
    ("pump failure", {"point": "driver.pump"}, 0),
    ("ring fault", {"point": "worker.ring_fault", "direction": "ingress"}, 1),
    ("device copy failure", {"point": "worker.copy", "direction": "host_to_device"}, 2),
    ("arena pressure", {"point": "arena.pressure", "lease_timeout_s": 2.0}, 1),
]

SETTLE_TRIES = 3
RSS_EVERY = 10
"""Print each node's and worker's resident memory every this many runs (the trend),
after a clean run."""


def _proc(pid: int) -> dict[str, int]:
    facts = {"fds": 0, "threads": 0, "rss_kib": 0}
    try:
        facts["fds"] = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                facts["threads"] = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                facts["rss_kib"] = int(line.split()[1])
    except OSError:
        pass
    return facts


def measure(rig: FaultRig) -> list[dict[str, int]]:
    status = rig.settled_status()
    rows = []
    for index, (node, state) in enumerate(zip(rig.cluster.nodes, status, strict=True)):
        workers = children(node.process.pid)
        worker = _proc(workers[0]) if workers else {"fds": 0, "threads": 0, "rss_kib": 0}
        rows.append({"node": index, **_proc(node.process.pid),
                     **{f"worker_{k}": v for k, v in worker.items()},
                     "leases": len(state["live_leases"])})
    return rows


def print_table(before: list[dict[str, int]], after: list[dict[str, int]]) -> None:
    keys = [k for k in before[0] if k != "node"]
    print(f"{'node':>4} " + " ".join(f"{k:>24}" for k in keys))
    for b, a in zip(before, after, strict=True):
        cells = [f"{b[k]:>7} -> {a[k]:>7} ({a[k] - b[k]:+d})" for k in keys]
        print(f"{b['node']:>4} " + " ".join(f"{c:>24}" for c in cells))


def leases_at_teardown(rig: FaultRig) -> set[tuple[int, int, int]]:
    """The (node, edge, ring) leases held now, without waiting (not already reported)."""
    return rig.leases(rig.run(rig._status())) - rig.held


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 50
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        rig = FaultRig(Path(tmp))
        try:
            rig.start()
            ok, detail = rig.clean_run(WARM_UP)
            if not ok:
                print(f"warm-up run failed: {detail}", file=sys.stderr)
                return 1
            before = measure(rig)
            stages = [int(m.node_id) for m in rig.members]
            for run in range(1, runs + 1):
                if run % 5 == 0:
                    name, entry, stage = FAULTS[(run // 5 - 1) % len(FAULTS)]
                    seen = rig.session(rig.options(), {**entry, "node": stages[stage]})
                    outcome = seen.report.result.outcome if seen.report else None
                    line = f"run {run:>3}: {name}: {outcome.value if outcome else seen.error}"
                    late = leases_at_teardown(rig)
                    if late:
                        line += f"; leases at run_torn_down: {sorted(late)}"
                    if outcome is None or outcome.value != "Faulted" or late:
                        problems.append(line)
                else:
                    ok, detail = rig.clean_run()
                    line = f"run {run:>3}: clean: {'ok' if ok else detail}"
                    if not ok:
                        problems.append(line)
                        rig.held |= rig.leases(rig.settled_status())  # report a leak once
                print(line, flush=True)
                if (run + 1) % RSS_EVERY == 0:  # a clean run (a fault run is every fifth)
                    print(f"  rss KiB after run {run}: " + ", ".join(
                        f"node {r['node']} {r['rss_kib']}/{r['worker_rss_kib']}"
                        for r in measure(rig)) + " (node/worker)", flush=True)
            for attempt in range(1, SETTLE_TRIES + 1):
                ok, detail = rig.clean_run()
                print(f"settle run {attempt}: {'ok' if ok else detail}", flush=True)
                if ok:
                    break
            else:
                problems.append(f"settle: no clean run in {SETTLE_TRIES} tries: {detail}")
            after = measure(rig)
        finally:
            rig.close()
    print()
    print_table(before, after)
    if any(row["leases"] for row in after):
        problems.append("leases left after the soak")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
