"""Where a token's time goes, and how long bring-up takes, from one run's lifecycle events.

Theory of operation
-------------------
Every process of a run (the orchestrator and each stage node) writes its lifecycle
events (spec §40) as JSON lines; each record carries ``mono``, the emitting process's
``time.monotonic_ns()``. On one machine (loopback, or network namespaces, which share
the clock) that is one clock, so intervals between events of different processes are
meaningful. Nothing here times anything: it only subtracts recorded timestamps.

A decode token ``s`` (``s >= 1``) travels: orchestrator ``token_received(s-1)`` ->
stage 0 ``object_loaded(s)`` -> ``execute_step_started(s)`` -> (worker step; its output
committed to the egress ring: ``object_produced(s)``) -> ``step_completed(s)`` -> stage 1
``object_loaded(s)`` ... -> orchestrator ``token_received(s)``. Per stage and token:

- ``inbound``: upstream ``object_produced`` (stage 0: the orchestrator's previous
  ``token_received``) to this stage's ``object_loaded``: the send pump reading the
  egress ring, QUIC over the edge, the recv pump writing the ingress ring, the worker
  copying it to the device, and each side's event report. `split_inbound` divides it
  into ring copies (estimated from bytes and a measured ring copy rate) and the rest
  (QUIC, pumps, reports);
- ``control``: ``object_loaded`` to ``execute_step_started`` (StageController dispatch);
- ``compute``: ``execute_step_started`` to ``step_completed`` (the worker's step, with
  its egress ring write and the JSON-line round trip to the node);
- ``waiting``: the rest of the token period (``token_received(s) - token_received(s-1)``):
  the stage idles while other stages and the orchestrator work on the token.

The four add up to the token period for each stage. Tokens before ``warmup`` decode
steps are left out (tinygrad compiles the decode kernels on the first ones), and so is a
token whose step events some stage did not record (the run's last step_completed can
be lost when the run stops right after its token).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Record = Mapping[str, Any]
STEP_EVENTS = ("object_loaded", "execute_step_started", "object_produced", "step_completed")
MS = 1e6  # ns per ms


class EventsError(Exception):
    """A run's event logs lack what a figure needs; the message names the event."""


@dataclass(frozen=True)
class Spread:
    """min / median / max of a list of values."""

    min: float
    median: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(min(values), statistics.median(values), max(values), len(values))

    def to_json(self) -> dict[str, float]:
        return {"min": self.min, "median": self.median, "max": self.max, "n": self.n}


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON record in these files (lines that do not parse are skipped)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "event" in record and "mono" in record:
                records.append(record)
    return records


class RunEvents:
    """One run's events, indexed by (event, stage, sequence)."""

    def __init__(self, records: Sequence[Record], run_id: int | None = None) -> None:
        if run_id is not None:
            records = [r for r in records if r.get("run_id") in (None, run_id)]
        self.records = records
        self.stage_of_node: dict[int, int] = {}
        for record in records:
            if record["event"] == "stage_ready":
                self.stage_of_node[int(record["node_id"])] = int(record["stage_index"])
        self.stages = len(set(self.stage_of_node.values()))
        self._at: dict[tuple[str, int, int], int] = {}
        self.tokens: dict[int, int] = {}
        for record in records:
            event = record["event"]
            if event == "token_received":
                self.tokens.setdefault(int(record["sequence"]), int(record["mono"]))
            elif event in STEP_EVENTS:
                stage = int(record["stage_index"])
                self._at.setdefault((event, stage, int(record["sequence"])), int(record["mono"]))

    def at(self, event: str, stage: int, sequence: int) -> int:
        try:
            return self._at[(event, stage, sequence)]
        except KeyError:
            raise EventsError(f"no {event} for stage {stage} sequence {sequence}") from None

    def complete(self, sequence: int) -> bool:
        """Whether every stage recorded all four step events of `sequence` (the last
        step_completed of a run can be lost when the run stops right after its token)."""
        return all((event, stage, sequence) in self._at for stage in range(self.stages)
                   for event in STEP_EVENTS)

    def first(self, event: str, **match: int) -> int:
        """mono of the first `event` whose fields equal `match`."""
        for record in self.records:
            if record["event"] == event and all(record.get(k) == v for k, v in match.items()):
                return int(record["mono"])
        raise EventsError(f"no {event} {match or ''}".rstrip())

    def decode_sequences(self, warmup: int) -> list[int]:
        """Decode token sequences past the warm-up whose whole path was recorded."""
        return [s for s in sorted(self.tokens) if s > warmup and s - 1 in self.tokens]


def token_periods_ms(run: RunEvents, warmup: int) -> list[float]:
    """token_received(s) - token_received(s-1) for steady decode tokens, in ms."""
    return [(run.tokens[s] - run.tokens[s - 1]) / MS for s in run.decode_sequences(warmup)]


def stage_breakdown(run: RunEvents, warmup: int) -> list[dict[str, list[float]]]:
    """Per stage: inbound / control / compute / waiting per steady decode token, in ms."""
    sequences = [s for s in run.decode_sequences(warmup) if run.complete(s)]
    if not sequences:
        raise EventsError(f"no decode token past the first {warmup} with every stage's "
                          "events")
    out: list[dict[str, list[float]]] = []
    for stage in range(run.stages):
        parts: dict[str, list[float]] = {"inbound": [], "control": [], "compute": [],
                                         "waiting": [], "extent": []}
        for s in sequences:
            upstream = (run.tokens[s - 1] if stage == 0
                        else run.at("object_produced", stage - 1, s))
            loaded = run.at("object_loaded", stage, s)
            started = run.at("execute_step_started", stage, s)
            completed = run.at("step_completed", stage, s)
            period = run.tokens[s] - run.tokens[s - 1]
            inbound, control, compute = loaded - upstream, started - loaded, completed - started
            parts["inbound"].append(inbound / MS)
            parts["control"].append(control / MS)
            parts["compute"].append(compute / MS)
            parts["waiting"].append((period - inbound - control - compute) / MS)
        parts["extent"] = [float(e) for e in _extents(run, stage, sequences)]
        out.append(parts)
    return out


def _extents(run: RunEvents, stage: int, sequences: Sequence[int]) -> list[int]:
    wanted = set(sequences)
    return [int(r.get("detail", {}).get("extent", 0)) for r in run.records
            if r["event"] == "object_loaded" and r.get("stage_index") == stage
            and r.get("sequence") in wanted]


def split_inbound(inbound_ms: float, extent: float, ring_gbps: float,
                  copies: int = 4) -> tuple[float, float]:
    """(ring copies ms, rest ms): `copies` ring copies of `extent` bytes at `ring_gbps`.

    The rest is QUIC, the pumps and the event reports; never below zero."""
    ring_ms = copies * extent / (ring_gbps * 1e9) * 1e3 if ring_gbps > 0 else 0.0
    ring_ms = min(ring_ms, inbound_ms)
    return ring_ms, max(inbound_ms - ring_ms, 0.0)


def bring_up(run: RunEvents) -> dict[str, Any]:
    """Bring-up intervals in seconds, from the events (module doc)."""
    nodes = sorted(run.stage_of_node.items(), key=lambda item: item[1])
    boot = [(run.first("node_available", node_id=n) - run.first("node_started", node_id=n))
            / 1e9 for n, _ in nodes]
    pool = run.first("pool_ready")
    barrier = run.first("readiness_barrier_passed")
    stages = []
    for node, stage in nodes:
        def since_pool(event: str, node: int = node) -> float:
            return (run.first(event, node_id=node) - pool) / 1e9
        stages.append({
            "stage": stage,
            "node_start_to_available_s": boot[stage],
            "pool_to_download_started_s": since_pool("weights_download_started"),
            "pool_to_downloaded_s": since_pool("weights_downloaded"),
            "pool_to_weights_loaded_s": since_pool("weights_loaded"),
            "pool_to_stage_ready_s": since_pool("stage_ready"),
        })
    return {"pool_ready_to_barrier_s": (barrier - pool) / 1e9,
            "node_start_to_available_s": boot, "stages": stages}
