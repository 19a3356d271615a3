"""Fault injection: named hook points that the running system consults (tests only).

Theory of operation. A component that can be made to fail calls `hit(point, **facts)` at
one place; it returns the matching fault entry (a dict) or None. Entries come from the
JSON file named by the `SWACTOR_FAULT_INJECT` environment variable, re-read whenever its
modification time changes, so a test can arm and disarm faults on a running cluster
between runs. Without the variable every `hit` is None after one `os.environ` lookup.

The data path does not call `hit` itself: its hook points are the methods of a `Faults`
port, which the send pump (through `Driver` and `QuicTransport`), the worker's rings,
step runner, device bridge and command loop take as a parameter. Its default,
`NO_FAULTS`, answers "no fault" at the cost of one method call; a node, an orchestrator
session and a worker process pass `from_env()`, which is `FileFaults` (answers from the
file through `hit`) when the variable is set; a unit test passes a `Faults` of its own.
A node's `ArenaManager` takes the port too, and asks it (`lease_pressure`) before it
feeds each event, so its `fits_now` guard reads only its own ledger. The remaining
control-path points (`node.*`, `artifact.range`, the edge lease timer of
`arena.pressure`) call `hit`.

The file holds `{"faults": [ENTRY, ...]}`. An ENTRY names its `point`, optionally the
`node` (decimal node id) it applies to, and any facts the hook passes (e.g. `sequence`);
an entry matches when every such key equals the hook's fact. Other keys are parameters
the hook reads (`mode`, `bytes`, `after_bytes`, `path`, `delay_s`). `bind_node(node_id)`
records this process's node id in `SWACTOR_FAULT_NODE`, so a node's worker process (it
inherits the environment) matches the same `node` entries.

Hook points:

- `node.provision_reject` (node control handler): ProvisionStage refused.
- `node.ring_oversize` (EdgeKeeper lease): the ring asks for the whole arena and more.
- `node.weights_path` (WorkerStagePorts.load_weights): the GGUF is read from `path`.
- `artifact.range` (ArtifactChannel, serving a range of an offered file): one byte of
  the answer is flipped, as a tampered or corrupt range would arrive.
- `worker.step` (step runner, per `sequence`): `mode` raise / kill (SIGKILL of the
  worker itself) / delay (`delay_s`).
- `worker.fatal` (worker command loop, per `command` event name): an exception escapes
  worker code (WorkerFatal UnhandledException).
- `worker.alloc_cap` (DeviceBridge.alloc): allocations above `bytes` fail as device OOM.
- `worker.egress_header` (egress producer, per `sequence`): `mode` garble (bad header
  bytes) / sequence (the header names another sequence).
- `driver.connect` (send pump, per `edge`): the connection attempt fails as a
  handshake failure (HandshakeFailed).
- `driver.send` (send pump, per `edge`): once `after_bytes` were sent, `mode` reset
  (RESET_STREAM) or fin (half the span, then FIN: EOF mid-object).
- `driver.pump` (send pump drain loop, per `edge`): the pump fails (its ring read
  raises), so the pump stops with StreamFault(PumpFailed).
- `arena.pressure` (a node's ArenaManager, through `Faults.lease_pressure` before each
  event, and the EdgeEstablisher lease timer): no lease fits now, so every request is
  queued; the edge's lease timer is `lease_timeout_s` (default: the node's), after
  which the edge fails with ArenaPressureTimeout.
- `worker.ring_fault` (worker ring consumer, per `direction` ingress/egress): the
  worker faults the shared ring (WorkerInternal) before its next read or write.
- `worker.copy` (DeviceBridge copies, per `direction` host_to_device/device_to_host
  and `object_id`): the device copy fails (DeviceCopyFailed).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_FILE = "SWACTOR_FAULT_INJECT"
ENV_NODE = "SWACTOR_FAULT_NODE"

_cache: dict[str, tuple[tuple[int, int, int], list[dict[str, Any]]]] = {}


def bind_node(node_id: int) -> None:
    """Record this process's node id for `node` matching (inherited by its worker)."""
    if os.environ.get(ENV_FILE):
        os.environ[ENV_NODE] = str(int(node_id))


def _entries(path: str) -> list[dict[str, Any]]:
    try:
        info = os.stat(path)
    except OSError:
        return []
    cached = _cache.get(path)
    mtime = (info.st_mtime_ns, info.st_ino, info.st_size)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        document = json.loads(Path(path).read_text())
        entries = [e for e in document.get("faults", []) if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError):
        entries = []
    _cache[path] = (mtime, entries)
    return entries


def hit(point: str, **facts: object) -> dict[str, Any] | None:
    """The armed entry for `point` matching `facts` and this node, or None."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return None
    node = os.environ.get(ENV_NODE)
    for entry in _entries(path):
        if entry.get("point") != point:
            continue
        if "node" in entry and str(entry["node"]) != node:
            continue
        if all(entry[key] == value for key, value in facts.items() if key in entry):
            return entry
    return None


def arm(path: Path, *entries: dict[str, Any]) -> None:
    """Write the fault file (atomically: readers never see half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": list(entries)}))
    os.replace(tmp, path)


class Faults:
    """The fault port of the data path: one question per hook point, each answered "no
    fault" here. Components on the hot path (send pump, worker rings, steps, device
    copies, command loop) take one as a parameter whose default is `NO_FAULTS`; a
    process entry passes `from_env()`, a unit test a subclass of its own."""

    def connect_fails(self, edge: int) -> bool:
        """`driver.connect`: the send pump's connection attempt fails (HandshakeFailed)."""
        return False

    def pump_fails(self, edge: int) -> bool:
        """`driver.pump`: the send pump of `edge` fails now (its ring read raises)."""
        return False

    def stream_cut(self, edge: int, sent_before: int, moved: int) -> str | None:
        """`driver.send`: "reset" or "fin" to cut the stream of `edge` after this span,
        "hold" to write nothing more, None to go on."""
        return None

    def ring_faults(self, direction: str) -> bool:
        """`worker.ring_fault`: the worker faults its `direction` ring now."""
        return False

    def header_bytes(
        self, packed: bytes, sequence: int, repack: Callable[[int], bytes]
    ) -> bytes:
        """`worker.egress_header`: the header bytes the producer writes for `sequence`
        (`repack(s)` packs the same header with sequence `s`)."""
        return packed

    def worker_step(self, sequence: int) -> None:
        """`worker.step`: called just before a role runs step `sequence`."""

    def alloc_refused(self, extent: int) -> bool:
        """`worker.alloc_cap`: an allocation of `extent` bytes fails as device OOM."""
        return False

    def copy_fails(self, direction: str, object_id: int) -> bool:
        """`worker.copy`: a `direction` copy of object `object_id` fails."""
        return False

    def worker_fatal(self, command: str) -> bool:
        """`worker.fatal`: handling a `command` event raises in worker code."""
        return False

    def lease_pressure(self) -> bool:
        """`arena.pressure`: no new ring lease fits now (a request is queued)."""
        return False


NO_FAULTS = Faults()


class FileFaults(Faults):
    """Answers from the entries armed in the `SWACTOR_FAULT_INJECT` file (`hit`)."""

    def __init__(self) -> None:
        self._finished_edges: set[int] = set()

    def connect_fails(self, edge: int) -> bool:
        return hit("driver.connect", edge=edge) is not None

    def pump_fails(self, edge: int) -> bool:
        return hit("driver.pump", edge=edge) is not None

    def stream_cut(self, edge: int, sent_before: int, moved: int) -> str | None:
        entry = hit("driver.send", edge=edge)
        if entry is None or sent_before + moved < int(entry.get("after_bytes", 0)):
            return None
        mode = str(entry.get("mode", "reset"))
        if mode == "fin":
            if edge in self._finished_edges:
                return "hold"
            self._finished_edges.add(edge)
        return mode

    def ring_faults(self, direction: str) -> bool:
        return hit("worker.ring_fault", direction=direction) is not None

    def header_bytes(
        self, packed: bytes, sequence: int, repack: Callable[[int], bytes]
    ) -> bytes:
        entry = hit("worker.egress_header", sequence=sequence)
        if entry is None:
            return packed
        if entry.get("mode") == "sequence":
            return bytes(repack(sequence + 5))
        return b"\xa5" * len(packed)

    def worker_step(self, sequence: int) -> None:
        entry = hit("worker.step", sequence=sequence)
        if entry is None:
            return
        mode = entry.get("mode")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "delay":
            time.sleep(float(entry.get("delay_s", 0.2)))
        elif mode == "raise":
            raise RuntimeError(f"injected step failure at sequence {sequence}")

    def alloc_refused(self, extent: int) -> bool:
        entry = hit("worker.alloc_cap")
        return entry is not None and extent > int(entry.get("bytes", 0))

    def copy_fails(self, direction: str, object_id: int) -> bool:
        return hit("worker.copy", direction=direction, object_id=object_id) is not None

    def worker_fatal(self, command: str) -> bool:
        return hit("worker.fatal", command=command) is not None

    def lease_pressure(self) -> bool:
        return hit("arena.pressure") is not None


def from_env() -> Faults:
    """The fault port of this process: `FileFaults` when `SWACTOR_FAULT_INJECT` names a
    file, else `NO_FAULTS`."""
    return FileFaults() if os.environ.get(ENV_FILE) else NO_FAULTS


def lease_timeout_s(default: float) -> float:
    """`arena.pressure` hook: the lease timer of a new edge record (`lease_timeout_s`)."""
    entry = hit("arena.pressure")
    return default if entry is None else float(entry.get("lease_timeout_s", default))
