"""Where a serving level's time went: per-stage busy time, objects in flight, rows per
object, CPU per process kind (``python -m bench serve --trace``).

Theory of operation
-------------------
A swactor server started with ``--events-dir`` writes every process's lifecycle events
(spec §40) as JSON lines: each node its stage's four step events per object, stamped
with the worker's own monotonic clock (``object_loaded``, ``execute_step_started``,
``object_produced``, ``step_completed``), the orchestrator one ``token_received`` per
output object, whose ``detail`` on a serving run says how many decode rows the object
carried (0: a prompt) and how many objects were in flight when it came back. The clock
is the host's ``CLOCK_MONOTONIC``, one for every process, so the harness reads it
(``time.monotonic_ns``) at the start and end of a level and keeps what fell inside:

- per stage: steps completed, the fraction of the window its worker was inside a step
  (``execute_step_started`` -> ``step_completed``, clipped to the window), the median
  step time;
- per level: output objects, their decode rows (rows per decode object), prompts, and
  the objects in flight when each came back (mean, and how often each count);
- per level, how many stages were inside a step at once (the share of the window with
  0, 1, 2, ... computing, and their mean), and the share in which only prompts'
  prefills computed: every edge is FIFO (spec §34), so a decode object behind a prompt
  waits where the prompt computes, and while prefills alone compute the decoding
  sequences make no progress;
- per level, the hops of objects that travelled alone (back with one object in flight,
  so no step of another object delays a load): the median stage -> next stage (its
  ``object_produced`` -> the next stage's ``object_loaded``), last stage -> orchestrator
  (``object_produced`` -> ``token_received``) and orchestrator -> stage 0
  (``token_received`` -> the next decode object's ``object_loaded``, which holds the
  orchestrator's own turn: routing the tokens, writing the next input). A decode
  object's round trip has one place more than the stages; these say what it costs
  beside a hop between stages.

``CpuWindow`` reads ``utime + stime`` of every process under the server's root (the
``swactor serve`` process: orchestrator and HTTP front; its nodes; their workers) and
the machine's busy CPU time (``/proc/stat``) at both ends of the window, so a level also
says how many cores each kind of process used and how many the rest of the machine took.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._cputime import cpu_s, tree

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def read_events(events_dir: Path) -> list[dict[str, Any]]:
    """Every event line of every ``*.jsonl`` file in ``events_dir`` (torn or foreign
    lines skipped: a process may be writing its last line now)."""
    events = []
    for path in sorted(events_dir.glob("*.jsonl")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("mono"), int):
                events.append(record)
    return events


def _overlap(start: int, end: int, lo: int, hi: int) -> int:
    return max(0, min(end, hi) - max(start, lo))


@dataclass
class StageFigures:
    """One stage's steps inside a window."""

    steps: int
    busy: float
    """Fraction of the window the stage's worker was inside a step."""
    median_step_ms: float | None


@dataclass
class TraceFigures:
    """What the events of one window say (module doc)."""

    window_s: float
    stages: dict[int, StageFigures] = field(default_factory=dict)
    outputs: int = 0
    prompts: int = 0
    decode_objects: int = 0
    decode_rows: int = 0
    in_flight: dict[int, int] = field(default_factory=dict)
    """Objects in flight when an output came back (itself included) -> how often."""
    hops_ms: dict[str, float] = field(default_factory=dict)
    """Median hops of objects that travelled alone (module doc): ``stage_to_stage``,
    ``to_orchestrator``, ``orchestrator_to_stage0``; those with no sample left out."""
    computing: dict[int, float] = field(default_factory=dict)
    """Stages inside a step at once -> the share of the window they were."""
    prefills_alone: float = 0.0
    """Share of the window in which stages computed and every one of them a prompt."""

    @property
    def rows_per_decode_object(self) -> float | None:
        return self.decode_rows / self.decode_objects if self.decode_objects else None

    @property
    def mean_computing(self) -> float | None:
        share = sum(self.computing.values())
        return sum(k * v for k, v in self.computing.items()) / share if share else None

    @property
    def mean_in_flight(self) -> float | None:
        total = sum(self.in_flight.values())
        return (sum(k * v for k, v in self.in_flight.items()) / total) if total else None


def window_figures(events: Iterable[Mapping[str, Any]], start_ns: int, end_ns: int
                   ) -> TraceFigures:
    """The figures of the events between ``start_ns`` and ``end_ns`` (module doc)."""
    figures = TraceFigures(window_s=max(0, end_ns - start_ns) / 1e9)
    started: dict[tuple[Any, int, int], int] = {}
    spans: dict[int, list[tuple[int, int]]] = {}
    marks: dict[tuple[Any, int], dict[tuple[int, str], int]] = {}
    outputs: dict[tuple[Any, int], tuple[int, Any, Any]] = {}
    timed: list[tuple[int, int, tuple[Any, int]]] = []
    for event in sorted(events, key=lambda e: int(e["mono"])):
        name, mono = event.get("event"), int(event["mono"])
        if name in ("object_loaded", "object_produced") and "sequence" in event:
            marks.setdefault((event.get("run_id"), int(event["sequence"])), {})[
                (int(event.get("stage_index", -1)), str(name))] = mono
        if name == "token_received" and isinstance(event.get("sequence"), int):
            detail = event.get("detail") or {}
            outputs[(event.get("run_id"), event["sequence"])] = (
                mono, detail.get("rows"), detail.get("in_flight"))
        if name == "execute_step_started":
            started[(event.get("run_id"), int(event["stage_index"]),
                     int(event["sequence"]))] = mono
        elif name == "step_completed":
            key = (event.get("run_id"), int(event["stage_index"]), int(event["sequence"]))
            begin = started.pop(key, None)
            if begin is not None and _overlap(begin, mono, start_ns, end_ns) > 0:
                spans.setdefault(key[1], []).append((begin, mono))
                timed.append((begin, mono, (key[0], key[2])))
        elif name == "token_received" and start_ns <= mono <= end_ns:
            figures.outputs += 1
            detail = event.get("detail") or {}
            rows, in_flight = detail.get("rows"), detail.get("in_flight")
            if isinstance(rows, int):
                if rows == 0:
                    figures.prompts += 1
                else:
                    figures.decode_objects += 1
                    figures.decode_rows += rows
            if isinstance(in_flight, int):
                figures.in_flight[in_flight] = figures.in_flight.get(in_flight, 0) + 1
    figures.hops_ms = _hops(marks, outputs, start_ns, end_ns)
    prompts = {key for key, (_mono, rows, _in_flight) in outputs.items() if rows == 0}
    figures.computing, figures.prefills_alone = _at_once(
        [(b, e, key in prompts) for b, e, key in timed], start_ns, end_ns)
    window = max(1, end_ns - start_ns)
    for stage, steps in sorted(spans.items()):
        inside = [(b, e) for b, e in steps if start_ns <= e <= end_ns]
        busy = sum(_overlap(b, e, start_ns, end_ns) for b, e in steps)
        figures.stages[stage] = StageFigures(
            steps=len(inside), busy=busy / window,
            median_step_ms=(statistics.median((e - b) / 1e6 for b, e in inside)
                            if inside else None))
    return figures


def _at_once(steps: Iterable[tuple[int, int, bool]], start_ns: int, end_ns: int
             ) -> tuple[dict[int, float], float]:
    """Steps ``(begin, end, a prompt's)`` -> (stages computing at once -> share of the
    window, share in which only prompts' steps computed)."""
    window = max(1, end_ns - start_ns)
    marks: list[tuple[int, int, bool]] = []
    for begin, end, prompt in steps:
        if _overlap(begin, end, start_ns, end_ns) > 0:
            marks += [(max(begin, start_ns), 1, prompt), (min(end, end_ns), -1, prompt)]
    marks.sort(key=lambda mark: (mark[0], mark[1]))  # ends before starts at one instant
    shares: dict[int, int] = {}
    alone = 0
    now, computing, prefills = start_ns, 0, 0
    for at, change, prompt in [*marks, (end_ns, 0, False)]:
        shares[computing] = shares.get(computing, 0) + at - now
        if computing and computing == prefills:
            alone += at - now
        now, computing = at, computing + change
        prefills += change if prompt else 0
    return ({k: v / window for k, v in sorted(shares.items()) if v > 0}, alone / window)


def _hops(marks: Mapping[tuple[Any, int], Mapping[tuple[int, str], int]],
          outputs: Mapping[tuple[Any, int], tuple[int, Any, Any]], start_ns: int,
          end_ns: int) -> dict[str, float]:
    """Median hops (ms) of the objects back in the window with one in flight."""
    samples: dict[str, list[float]] = {"stage_to_stage": [], "to_orchestrator": [],
                                       "orchestrator_to_stage0": []}
    for (run, sequence), (mono, _rows, in_flight) in outputs.items():
        if in_flight != 1 or not start_ns <= mono <= end_ns:
            continue
        mark = marks.get((run, sequence), {})
        produced = sorted(stage for stage, name in mark if name == "object_produced")
        for stage in produced:
            loaded = mark.get((stage + 1, "object_loaded"))
            if loaded is not None:
                samples["stage_to_stage"].append(
                    (loaded - mark[(stage, "object_produced")]) / 1e6)
        if produced:
            samples["to_orchestrator"].append(
                (mono - mark[(produced[-1], "object_produced")]) / 1e6)
        after = outputs.get((run, sequence + 1))
        loaded = marks.get((run, sequence + 1), {}).get((0, "object_loaded"))
        if after is not None and isinstance(after[1], int) and after[1] > 0 and loaded:
            samples["orchestrator_to_stage0"].append((loaded - mono) / 1e6)
    return {name: statistics.median(values) for name, values in samples.items() if values}


def machine_busy_s() -> float | None:
    """CPU seconds every CPU of the machine spent busy (not idle or iowait) since boot."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(word) for word in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) * TICK_S


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "orchestrator+http"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return "other"
    if b"swactor.worker" in argv:
        return "workers"
    if b"node" in argv:
        return "nodes"
    return "other"


class CpuWindow:
    """CPU seconds of the server's processes by kind, and of the machine, over a window:
    ``start()`` then ``stop()`` (module doc)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._before: dict[int, float | None] = {}
        self._machine: float | None = None

    def start(self) -> None:
        self._before = {pid: cpu_s(pid) for pid in tree(self.root)}
        self._machine = machine_busy_s()

    def stop(self, wall_s: float) -> dict[str, float]:
        """Cores used in the window (CPU seconds / ``wall_s``) per kind, ``swactor``
        (their sum) and ``machine`` (every process of the host, this one's included)."""
        used: dict[str, float] = {}
        for pid, begin in self._before.items():
            end = cpu_s(pid)
            if begin is not None and end is not None:
                kind = _kind(pid, self.root)
                used[kind] = used.get(kind, 0.0) + end - begin
        cores = {kind: seconds / wall_s for kind, seconds in sorted(used.items())
                 if wall_s > 0}
        cores["swactor"] = sum(used.values()) / wall_s if wall_s > 0 else 0.0
        machine = machine_busy_s()
        if machine is not None and self._machine is not None and wall_s > 0:
            cores["machine"] = (machine - self._machine) / wall_s
        return cores


def trace_line(figures: TraceFigures) -> str:
    """One line: each stage's busy share, steps and median step, then the objects."""
    stages = ", ".join(
        f"stage {i} busy {100 * s.busy:.0f}% ({s.steps} steps, median "
        f"{'n/a' if s.median_step_ms is None else f'{s.median_step_ms:.1f}'} ms)"
        for i, s in figures.stages.items())
    rows = figures.rows_per_decode_object
    mean = figures.mean_in_flight
    spread = " ".join(f"{k}:{v}" for k, v in sorted(figures.in_flight.items()))
    computing = figures.mean_computing
    at_once = " ".join(f"{k}:{100 * v:.0f}%" for k, v in figures.computing.items())
    hops = figures.hops_ms
    words = {"stage_to_stage": "stage -> stage", "to_orchestrator": "last stage -> "
             "orchestrator", "orchestrator_to_stage0": "orchestrator -> stage 0"}
    return (f"{stages or 'no steps'}; {figures.outputs} objects out ({figures.prompts} "
            f"prompts), rows per decode object "
            f"{'n/a' if rows is None else f'{rows:.2f}'}, in flight at each output "
            f"{'n/a' if mean is None else f'{mean:.2f}'} ({spread or 'n/a'}), stages "
            f"computing at once {'n/a' if computing is None else f'{computing:.2f}'} "
            f"({at_once or 'n/a'}), only prefills computing "
            f"{100 * figures.prefills_alone:.0f}%"
            + ("; hops of lone objects (median): " + ", ".join(
                f"{words[name]} {value:.2f} ms" for name, value in hops.items())
               if hops else ""))


def cpu_line(cores: Mapping[str, float]) -> str:
    return "cores used: " + ", ".join(f"{kind} {value:.2f}" for kind, value in cores.items())
