"""GPU worker event payloads (spec §30) and their newline-JSON stdout lines.

Theory of operation
-------------------
The worker reports on stdout, one event per line, in the line format of `control`
(`{"type": <class name>, "body": {...}}`); `encode_event` / `decode_event` are the two
ends. Events name rings, edges and ports so that GpuWorkerCtl can route them in graph
terms; they never carry payload bytes. `decode_event` raises `ControlMessageError` for
a line that is not a known event (the node treats that as a worker/adapter fault, spec
§28) and the body's own `WireError` for a known event with a bad body.

Rules: `WorkerReady.pid >= 1` (u32) and `ring_helper_abi` is a u16; extents are u64;
`ObjectFailed.object_id`/`sequence` are None when the header was never parsed.
The wake hints `RingReadable` / `RingWritable` are shared with the command direction.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from swactor.wire.codec import JsonValue, WireStruct
from swactor.wire.control import decode_line, encode_line, registry_of
from swactor.wire.enums import (
    ObjectFailure,
    ReleaseFailure,
    RingFaultReason,
    RoleFailure,
    StepFailure,
    WorkerFatalReason,
    WorkerStoppedReason,
)
from swactor.wire.ids import (
    U32_MAX,
    DeviceObjectHandle,
    EdgeId,
    ObjectId,
    PortId,
    RingId,
    RoleId,
    Sequence,
    StepId,
    WorkerGeneration,
)
from swactor.wire.worker import RingReadable, RingWritable


@dataclass(frozen=True, slots=True)
class WorkerReady(WireStruct):
    """The worker mapped the arena and started its backend (spec §30)."""

    pid: int
    worker_generation: WorkerGeneration
    ring_helper_abi: int
    backend: JsonValue

    def _validate(self) -> None:
        self._check_range("pid", 1, U32_MAX)
        self._check_u16("ring_helper_abi")


@dataclass(frozen=True, slots=True)
class WorkerFatal(WireStruct):
    """The worker cannot continue (spec §30)."""

    reason: WorkerFatalReason


@dataclass(frozen=True, slots=True)
class WorkerStopped(WireStruct):
    """The worker stopped (spec §30)."""

    reason: WorkerStoppedReason


@dataclass(frozen=True, slots=True)
class StageFootprint(WireStruct):
    """What a configured model stage holds, measured at ready (extension beyond spec §30).

    `weights_bytes` and `kv_cache_bytes` are the role's device buffers (weights as held,
    KV cache for its slots x max_seq_len), `rss_bytes` the worker's resident set once the
    loader's host copies are freed, `file_bytes` its layer range's tensor bytes in the
    GGUF. Sizes only, never payload. `reused`: the worker served this ConfigureRole with
    the role it already held for the same stage of the same file (a node that keeps its
    stage across runs, or a warm spare): nothing was loaded or built."""

    weights_bytes: int
    kv_cache_bytes: int
    rss_bytes: int
    file_bytes: int
    reused: bool = False

    def _validate(self) -> None:
        for name in ("weights_bytes", "kv_cache_bytes", "rss_bytes", "file_bytes"):
            self._check_u64(name)


@dataclass(frozen=True, slots=True)
class RoleConfigured(WireStruct):
    """ConfigureRole succeeded (spec §30). `footprint` (extension): what a model stage
    role holds at ready; None for roles that hold no model."""

    role_id: RoleId
    footprint: StageFootprint | None = None


@dataclass(frozen=True, slots=True)
class RoleFailed(WireStruct):
    """ConfigureRole failed (spec §30)."""

    role_id: RoleId
    reason: RoleFailure


@dataclass(frozen=True, slots=True)
class RingInstalled(WireStruct):
    """InstallRing succeeded (spec §30)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId


@dataclass(frozen=True, slots=True)
class RingFault(WireStruct):
    """A ring faulted in the worker (spec §30)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId
    reason: RingFaultReason


@dataclass(frozen=True, slots=True)
class RingQuiesced(WireStruct):
    """The worker holds no state or copy on `ring_id` any more (spec §30)."""

    ring_id: RingId


@dataclass(frozen=True, slots=True)
class ObjectLoaded(WireStruct):
    """An ingress object is on the device as `device_handle` (spec §30)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId
    object_id: ObjectId
    sequence: Sequence
    extent: int
    device_handle: DeviceObjectHandle

    def _validate(self) -> None:
        self._check_u64("extent")


@dataclass(frozen=True, slots=True)
class ObjectProduced(WireStruct):
    """An egress object is fully committed to its ring (spec §30)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId
    object_id: ObjectId
    sequence: Sequence
    extent: int

    def _validate(self) -> None:
        self._check_u64("extent")


@dataclass(frozen=True, slots=True)
class ObjectFailed(WireStruct):
    """An object record was rejected or lost (spec §30)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId
    object_id: ObjectId | None
    sequence: Sequence | None
    reason: ObjectFailure


@dataclass(frozen=True, slots=True)
class StepRecord(WireStruct):
    """What a granted step did (extension beyond spec §30, see `GrantSteps`): its input
    object, its output object, and when (this host's monotonic clock, ns) the input was
    loaded, the step started, the output was committed and the step completed. The node
    emits the step's four §40 lifecycle events from it, stamped with these times, instead
    of hearing ObjectLoaded and ObjectProduced lines of their own."""

    sequence: Sequence
    input_object_id: ObjectId
    input_extent: int
    output_object_id: ObjectId
    output_extent: int
    loaded_ns: int
    started_ns: int
    produced_ns: int
    completed_ns: int

    def _validate(self) -> None:
        for name in ("input_extent", "output_extent", "loaded_ns", "started_ns",
                     "produced_ns", "completed_ns"):
            self._check_u64(name)


@dataclass(frozen=True, slots=True)
class StepCompleted(WireStruct):
    """All declared outputs of a step are produced (spec §30). `record` (extension): what
    the step of a standing grant did."""

    role_id: RoleId
    step_id: StepId
    record: StepRecord


@dataclass(frozen=True, slots=True)
class StepFailed(WireStruct):
    """A step failed (spec §30)."""

    role_id: RoleId
    step_id: StepId
    reason: StepFailure


@dataclass(frozen=True, slots=True)
class DeviceObjectReleased(WireStruct):
    """A device object was freed (spec §30)."""

    device_handle: DeviceObjectHandle


@dataclass(frozen=True, slots=True)
class ReleaseFailed(WireStruct):
    """ReleaseDeviceObject failed (spec §30)."""

    device_handle: DeviceObjectHandle
    reason: ReleaseFailure


WorkerEvent = (
    WorkerReady
    | WorkerFatal
    | WorkerStopped
    | RoleConfigured
    | RoleFailed
    | RingInstalled
    | RingFault
    | RingQuiesced
    | ObjectLoaded
    | ObjectProduced
    | ObjectFailed
    | StepCompleted
    | StepFailed
    | DeviceObjectReleased
    | ReleaseFailed
    | RingReadable
    | RingWritable
)

EVENT_TYPES: dict[str, type[WireStruct]] = registry_of(*typing.get_args(WorkerEvent))
"""What `decode_event` accepts: every member of `WorkerEvent`."""


def encode_event(event: WorkerEvent) -> str:
    """One stdout line (ending in a newline) for `event`."""
    return encode_line(event)


def decode_event(line: str | bytes) -> WorkerEvent:
    """Parse one stdout line; raise `ControlMessageError` or the body's `WireError`."""
    return typing.cast(WorkerEvent, decode_line(line, EVENT_TYPES, "WorkerEvent"))
