"""CPU time per decode token of every process of a run: a figure the machine's load barely moves.

Theory of operation
-------------------
On a shared machine a token's wall time depends on what else runs; the CPU time the
run's processes spend on it hardly does. `CpuSampler` is a run's ``during`` hook: it
polls the orchestrator's event log, and when ``start`` tokens have arrived (warm-up
over) it reads ``utime + stime`` (`/proc/PID/stat`) of every process under the run's
root (the `swactor run` process, which hosts the orchestrator, its node processes and
their workers); when ``stop`` tokens have arrived it reads them again. CPU ms per token
= the difference over the number of tokens received between the two reads. Each node
and worker is named by its stage (the node's ``stage_ready`` event carries its pid).
Beside each process's figure, its main thread's (``/proc/PID/task/PID/schedstat``, in
nanoseconds): a node's token path runs there, on its event loop, while its SWIM
membership thread probes the pool on a timer, so its share of a token grows with the
token's period rather than with the work of the token.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
POLL_S = 0.02
WAIT_S = 300.0


def tree(root: int) -> list[int]:
    """`root` and every descendant that is alive now."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    todo += [int(k) for k in handle.read().split()]
        except OSError:
            continue
    return pids


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime (fields 14, 15)


def main_thread_s(pid: int) -> float | None:
    """CPU seconds `pid`'s main thread ran (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _tokens(events_dir: Path) -> int:
    try:
        return (events_dir / "orchestrator.jsonl").read_text().count('"token_received"')
    except OSError:
        return 0


def _stages(events_dir: Path) -> dict[int, int]:
    """node pid -> stage index, from the nodes' stage_ready events."""
    found = {}
    for path in events_dir.glob("node-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"stage_ready"' in line:
                record = json.loads(line)
                found[int(record["pid"])] = int(record["stage_index"])
    return found


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def wait_tokens(events_dir: Path, count: int, root: int) -> int:
    """Tokens the run's event logs hold once they reach ``count``, the run's root process
    ``root`` ends or :data:`WAIT_S` passes, whichever comes first."""
    deadline = time.monotonic() + WAIT_S
    while (seen := _tokens(events_dir)) < count and time.monotonic() < deadline:
        if not _alive(root):
            break
        time.sleep(POLL_S)
    return seen


class CpuSampler:
    """CPU ms per token of each process of a run (module doc); call as `during(dir, pid)`."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.result: dict[str, Any] | None = None

    def __call__(self, events_dir: Path, root: int) -> None:
        first = wait_tokens(events_dir, self.start, root)
        before = {pid: cpu_s(pid) for pid in tree(root)}
        main_before = {pid: main_thread_s(pid) for pid in before}
        last = wait_tokens(events_dir, self.stop, root)
        after = {pid: cpu_s(pid) for pid in before}
        main_after = {pid: main_thread_s(pid) for pid in before}
        tokens = last - first
        if tokens <= 0:
            return
        stages = _stages(events_dir)
        rows = []
        for pid, begin in before.items():
            end = after.get(pid)
            if begin is None or end is None:
                continue
            if pid == root:
                role, stage = "orchestrator", None
            elif pid in stages:
                role, stage = "node", stages[pid]
            elif _parent(pid) in stages:
                role, stage = "worker", stages[_parent(pid) or 0]
            else:
                continue
            main_begin, main_end = main_before.get(pid), main_after.get(pid)
            main = (None if main_begin is None or main_end is None
                    else (main_end - main_begin) * 1e3 / tokens)
            rows.append({"role": role, "stage": stage, "pid": pid,
                         "cpu_ms_per_token": (end - begin) * 1e3 / tokens,
                         "main_thread_cpu_ms_per_token": main})
        rows.sort(key=lambda r: (r["stage"] if r["stage"] is not None else -1, r["role"]))
        self.result = {"tokens": tokens, "from_token": first, "processes": rows,
                       "total_cpu_ms_per_token": sum(r["cpu_ms_per_token"] for r in rows)}
