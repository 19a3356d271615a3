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

Growth beyond noise. Each node's and worker's RSS is sampled after every clean run. Over
the second half (after warm-up, and for a worker only since its last restart) a least-
squares line gives the slope (KiB per run) with its standard error and the residual
standard deviation (the run-to-run jitter around the trend). Growth is called beyond
noise when the slope is more than two standard errors above zero and the growth it
implies over that half exceeds twice the jitter; such a process is printed as a
`GROWTH:` line. It does not change the exit status (a shared host is noisy; read it).

Finding where memory goes. `--trace DIR` starts every node and worker with
`SWACTOR_MEMTRACE=DIR` (`swactor.memtrace`): every 10 runs each one dumps a tracemalloc
snapshot and its live objects by type, and at the end the first dump of the second half
is compared with the last, per process, by allocation traceback and by type.
`--frames 0` leaves tracemalloc off (RSS, glibc heap figures and object counts only);
`--trim` also records RSS after `malloc_trim(0)` (freed heap glibc had kept). `--keep
DIR` runs the cluster in DIR and keeps its lifecycle events.

Exit status 1 when a clean run did not complete, a fault run did not fault, or a lease
is held at run_torn_down or left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from swactor import memtrace
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


def fit(points: list[tuple[int, int]]) -> dict[str, float]:
    """Least-squares line through (run, KiB): slope and its standard error (KiB/run),
    residual standard deviation (the run-to-run jitter around the trend, KiB), the
    growth the slope implies over the points' span, and whether it is beyond noise."""
    n = len(points)
    if n < 4:
        return {"n": n, "slope": 0.0, "se": math.inf, "sd": 0.0, "growth": 0.0,
                "beyond": 0.0}
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    sd = math.sqrt(sum(r * r for r in residuals) / (n - 2))
    se = sd / math.sqrt(sxx)
    growth = slope * (xs[-1] - xs[0])
    beyond = slope - 2 * se > 0 and growth > 2 * sd
    return {"n": n, "slope": slope, "se": se, "sd": sd, "growth": growth,
            "beyond": float(beyond)}


def print_trend(samples: dict[str, list[tuple[int, int, int]]], first: int) -> list[str]:
    """Per process, the RSS slope over runs >= `first` (after warm-up) against its
    jitter (`fit`); the processes whose growth is beyond noise."""
    print(f"\nRSS trend after each clean run from run {first} (least squares; beyond noise "
          "= slope - 2 se > 0 and the implied growth > 2x the residual sd):")
    print(f"{'process':>14} {'n':>3} {'KiB/run':>9} {'+-se':>6} {'sd KiB':>7} "
          f"{'growth KiB':>10}  verdict")
    grown = []
    for name, points in samples.items():
        pid = points[-1][1] if points else 0
        same = [(run, kib) for run, p, kib in points if run >= first and p == pid]
        f = fit(same)
        verdict = "beyond noise" if f["beyond"] else "within noise"
        print(f"{name:>14} {int(f['n']):>3} {f['slope']:>9.2f} {f['se']:>6.2f} "
              f"{f['sd']:>7.1f} {f['growth']:>10.0f}  {verdict}")
        if f["beyond"]:
            grown.append(f"{name}: RSS +{f['slope']:.1f} KiB/run (se {f['se']:.1f}) over "
                         f"runs {same[0][0]}-{same[-1][0]}, beyond its jitter "
                         f"(sd {f['sd']:.0f} KiB)")
    return grown


def processes(rig: FaultRig) -> dict[str, int]:
    """'node i' and 'worker i' -> pid, now."""
    found = {}
    for index, node in enumerate(rig.cluster.nodes):
        found[f"node {index}"] = node.process.pid
        workers = children(node.process.pid)
        if workers:
            found[f"worker {index}"] = workers[0]
    return found


def trace_dump(rig: FaultRig, folder: Path, run: int) -> None:
    """SIGUSR2 every node and worker (`swactor.memtrace`), wait for their dumps."""
    for name, pid in processes(rig).items():
        role = name.split()[0]
        before = set(folder.glob(f"{role}-{pid}-*.json"))
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            fresh = set(folder.glob(f"{role}-{pid}-*.json")) - before
            if fresh:
                (folder / "runs.txt").open("a").write(f"{run} {name} {fresh.pop().stem}\n")
                break
            time.sleep(0.1)
        else:
            print(f"  trace: {name} (pid {pid}) wrote no dump", flush=True)


def trace_report(folder: Path, first: int, top: int = 12) -> None:
    """Per process: the first dump at or after run `first` against the last one, by
    allocation traceback and by live objects per type (module doc of swactor.memtrace)."""
    dumps: dict[str, list[tuple[int, str]]] = {}
    for line in (folder / "runs.txt").read_text().splitlines():
        run, role, index, stem = line.split()
        dumps.setdefault(f"{role} {index}", []).append((int(run), stem))
    for name, entries in dumps.items():
        pid = entries[-1][1].split("-")[1]
        same = [(run, stem) for run, stem in entries if stem.split("-")[1] == pid]
        later = [e for e in same if e[0] >= first] or same
        if len(later) < 2:
            continue
        (run_a, stem_a), (run_b, stem_b) = later[0], later[-1]
        span = run_b - run_a
        a = json.loads((folder / f"{stem_a}.json").read_text())
        b = json.loads((folder / f"{stem_b}.json").read_text())
        print(f"\n== {name} (pid {pid}) runs {run_a} -> {run_b}: RSS {a['rss_kib']} -> "
              f"{b['rss_kib']} KiB ({(b['rss_kib'] - a['rss_kib']) / span:+.1f}/run); "
              f"malloc in use {a['malloc'].get('in_use', 0) >> 10} -> "
              f"{b['malloc'].get('in_use', 0) >> 10} KiB, free "
              f"{a['malloc'].get('free', 0) >> 10} -> {b['malloc'].get('free', 0) >> 10} KiB"
              + (f"; after malloc_trim RSS {a['rss_kib_trimmed']} -> {b['rss_kib_trimmed']}"
                 if "rss_kib_trimmed" in b else ""))
        types_a, types_b = a["types"], b["types"]
        grown = sorted(((types_b.get(k, 0) - types_a.get(k, 0), k)
                        for k in set(types_a) | set(types_b)), reverse=True)
        print("  live objects gained: " + ", ".join(
            f"{k} +{d}" for d, k in grown[:top] if d > 0) or "  live objects: none gained")
        timers = sorted(((n, k) for k, n in b.get("timers", {}).items()), reverse=True)
        if timers:
            print("  asyncio timers queued at the last dump: " + ", ".join(
                f"{k} x{n}" for n, k in timers[:6]))
        tm_a, tm_b = folder / f"{stem_a}.tm", folder / f"{stem_b}.tm"
        if not (tm_a.exists() and tm_b.exists()):
            continue
        old = tracemalloc.Snapshot.load(str(tm_a))
        new = tracemalloc.Snapshot.load(str(tm_b))
        total = sum(s.size_diff for s in new.compare_to(old, "filename"))
        print(f"  tracemalloc: {total / 1024:+.1f} KiB in total ({total / 1024 / span:+.2f} "
              "KiB/run); largest by traceback:")
        for stat in new.compare_to(old, "traceback")[:top]:
            if stat.size_diff <= 0:
                continue
            frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback[-4:]]
            print(f"    {stat.size_diff / 1024:+8.1f} KiB {stat.count_diff:+6d} blocks  "
                  + " <- ".join(reversed(frames)))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak",
                                     description="RUNS runs on one 3-node cluster, a fault "
                                     "every fifth (module doc)")
    parser.add_argument("runs", nargs="?", type=int, default=50)
    parser.add_argument("--trace", type=Path, default=None, metavar="DIR",
                        help="start every node and worker with SWACTOR_MEMTRACE=DIR and dump "
                        "tracemalloc snapshots and object counts every 10 runs; compare "
                        "the second half's first and last dumps at the end")
    parser.add_argument("--frames", type=int, default=12,
                        help="tracemalloc frames per allocation with --trace (0: no "
                        "tracemalloc, only RSS, malloc figures and object counts)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="run the cluster in DIR and keep it (keys, lifecycle events) "
                        "instead of a temporary folder")
    parser.add_argument("--trim", action="store_true",
                        help="with --trace: each dump also calls malloc_trim(0) and records "
                        "RSS after it (changes the later RSS figures)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    runs = args.runs
    if args.trace is not None:
        args.trace.mkdir(parents=True, exist_ok=True)
        (args.trace / "runs.txt").write_text("")
        os.environ[memtrace.ENV_DIR] = str(args.trace.resolve())
        os.environ[memtrace.ENV_FRAMES] = str(args.frames)
        if args.trim:
            os.environ[memtrace.ENV_TRIM] = "1"
    problems: list[str] = []
    samples: dict[str, list[tuple[int, int, int]]] = {}
    """'node i' / 'worker i' -> (run, pid, RSS KiB) after each clean run."""
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
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
                    for proc_name, pid in processes(rig).items():
                        samples.setdefault(proc_name, []).append(
                            (run, pid, _proc(pid)["rss_kib"]))
                print(line, flush=True)
                if (run + 1) % RSS_EVERY == 0:  # a clean run (a fault run is every fifth)
                    print(f"  rss KiB after run {run}: " + ", ".join(
                        f"node {r['node']} {r['rss_kib']}/{r['worker_rss_kib']}"
                        for r in measure(rig)) + " (node/worker)", flush=True)
                    if args.trace is not None:
                        trace_dump(rig, args.trace, run)
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
    grown = print_trend(samples, runs // 2)
    if args.trace is not None:
        trace_report(args.trace, runs // 2)
    if any(row["leases"] for row in after):
        problems.append("leases left after the soak")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    for growth in grown:
        print(f"GROWTH: {growth}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
