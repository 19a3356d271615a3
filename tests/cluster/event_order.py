"""The legal order of the spec §40 lifecycle events in the JSON Lines logs of one run.

`check_run_order(records, run_id)` takes every record of every process of a cluster
(orchestrator and nodes) and returns the violations as lines (empty: legal). Rules:

- per node process: node_started, then node_available, before anything of a run;
- per stage (node + run): weights_download_started < weights_downloaded <
  weights_loaded < stage_ready; edge_provision_started < edge_ready < stage_ready;
  stage_ready < every object_loaded; per step sequence: object_loaded before
  object_produced; stage_stopped last;
- orchestrator (the run's events and the pool_ready of its session): pool_ready <
  run_planned < stage_provision_started < readiness_barrier_passed < prompt_injected <
  token_received (sequences 0, 1, ...) < run_completed | run_faulted < stop_run_sent <
  run_torn_down (last);
- across processes (wall clock): every stage_ready < readiness_barrier_passed, and the
  prompt_injected < the first object_loaded of every stage.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def read_records(paths: Iterable[Path]) -> list[Record]:
    records: list[Record] = []
    for path in paths:
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


def _first(records: list[Record], name: str) -> Record | None:
    return next((r for r in records if r["event"] == name), None)


def _before(problems: list[str], where: str, records: list[Record], a: str, b: str) -> None:
    """Every `a` comes before every `b` in `records` (file order)."""
    names = [r["event"] for r in records]
    if a not in names or b not in names:
        problems.append(f"{where}: missing {a if a not in names else b}")
        return
    last_a = max(i for i, n in enumerate(names) if n == a)
    first_b = min(i for i, n in enumerate(names) if n == b)
    if last_a > first_b:
        problems.append(f"{where}: {a} after {b}")


def check_run_order(records: list[Record], run_id: int) -> list[str]:
    problems: list[str] = []
    by_proc: dict[str, list[Record]] = {}
    for record in records:
        by_proc.setdefault(record["proc"], []).append(record)
    orchestrator = [p for p in by_proc if p.startswith("orchestrator")]
    if len(orchestrator) != 1:
        return [f"expected one orchestrator process, got {orchestrator}"]
    own = by_proc[orchestrator[0]]
    indices = [i for i, r in enumerate(own) if r.get("run_id") == run_id]
    if not indices:
        return [f"orchestrator: no event of run {run_id}"]
    pools = [i for i, r in enumerate(own[:indices[0]]) if r["event"] == "pool_ready"]
    orch = [own[i] for i in pools[-1:] + indices]
    chain = ["pool_ready", "run_planned", "stage_provision_started",
             "readiness_barrier_passed", "prompt_injected", "token_received"]
    for a, b in itertools.pairwise(chain):
        _before(problems, "orchestrator", orch, a, b)
    end = "run_completed" if _first(orch, "run_completed") else "run_faulted"
    for a, b in (("token_received", end), (end, "stop_run_sent"),
                 ("stop_run_sent", "run_torn_down")):
        _before(problems, "orchestrator", orch, a, b)
    if orch and orch[-1]["event"] != "run_torn_down":
        problems.append("orchestrator: run_torn_down is not last")
    sequences = [r["sequence"] for r in orch if r["event"] == "token_received"]
    if sequences != sorted(sequences) or sequences != list(range(len(sequences))):
        problems.append(f"orchestrator: token sequences {sequences}")
    barrier = _first(orch, "readiness_barrier_passed")
    injected = _first(orch, "prompt_injected")

    for proc, own in by_proc.items():
        if proc in orchestrator:
            continue
        _before(problems, proc, own, "node_started", "node_available")
        stage = [r for r in own if r.get("run_id") == run_id]
        where = f"{proc} run {run_id}"
        for a, b in (("weights_download_started", "weights_downloaded"),
                     ("weights_downloaded", "weights_loaded"),
                     ("weights_loaded", "stage_ready"),
                     ("edge_provision_started", "edge_ready"),
                     ("edge_ready", "stage_ready"),
                     ("stage_ready", "object_loaded")):
            _before(problems, where, stage, a, b)
        if stage and stage[-1]["event"] != "stage_stopped":
            problems.append(f"{where}: stage_stopped is not last")
        steps: dict[int, list[str]] = {}
        for record in stage:
            if record["event"] in ("object_loaded", "object_produced"):
                steps.setdefault(record["sequence"], []).append(record["event"])
        for sequence, names in steps.items():
            if names[:1] != ["object_loaded"]:
                problems.append(f"{where}: step {sequence} produced before loaded")
        ready = _first(stage, "stage_ready")
        loaded = _first(stage, "object_loaded")
        if barrier and ready and ready["wall"] > barrier["wall"]:
            problems.append(f"{where}: stage_ready after the readiness barrier")
        if injected and loaded and loaded["wall"] < injected["wall"]:
            problems.append(f"{where}: object_loaded before prompt_injected")
    return problems
