"""GPU worker command payloads (spec §29) and their newline-JSON control lines.

Theory of operation
-------------------
GpuWorkerCtl sends the worker one command per stdin line. Each command here is a frozen
wire dataclass; `encode_command(cmd)` writes one line `{"type": <class name>, "body":
<to_json()>}` and `decode_command(line)` parses it back (see `control` for the line
rules and errors). JSON values (`backend`, `config`) are low-frequency
metadata: bytes are rejected. `RingReadable`/`RingWritable` are wake hints (spec §21):
they carry only a ring id and travel both ways (also listed in `worker_events`).

Rules: `InstallRing.layout.ring_id == ring_id`; `InitializeWorker.arena_ceiling >= 1`;
an `AwaitedInput`'s `row_bytes >= 1`.

Step admission by standing grant (an extension beyond §29, in place of its
`ExecuteStep`, for spec §14's one step per inbound object without a command per
token): §29's ExecuteStep, one command per step naming its input handles, is not a
command here; `GrantSteps` is the only way a step runs. It authorises the worker to
run, for role `role_id`, one step per object that ingress ring `input.ring_id` loads,
in sequence order from `input.sequence`: step k (k = 0, 1, ...) has step id
`first_step_id + k`, takes the object of sequence `input.sequence + k` on port
`input.port_id` (bound by the worker when it is loaded, so no handle crosses the
wire), and writes `output` with object id and sequence advanced by k; `output` with
`per_input_row` gives its extent per row of that input (input rows = the loaded extent
/ `input.row_bytes`), since the input's size is known only when it arrives. The input
is released with its step. The grant stands until `RevokeSteps(role_id)`, a drain, or
the input ring's uninstall; then the objects the grant did not take are freed by the
worker. Each step is reported by one `StepCompleted` carrying a `StepRecord`
(`worker_events`), or by `StepFailed`. One grant per role.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from swactor.wire.codec import JsonValue, WireStruct
from swactor.wire.control import decode_line, encode_line, registry_of
from swactor.wire.enums import RingDirection, ShutdownMode, UninstallReason
from swactor.wire.errors import PlanError
from swactor.wire.ids import (
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
from swactor.wire.objects import ObjectSpec
from swactor.wire.rings import RingLayout


@dataclass(frozen=True, slots=True)
class InitializeWorker(WireStruct):
    """Map the arena, check the ring helper ABI, start the backend (spec §29)."""

    worker_generation: WorkerGeneration
    arena_ceiling: int
    required_ring_helper_abi: int
    backend: JsonValue

    def _validate(self) -> None:
        self._check_range("arena_ceiling", 1, (1 << 64) - 1)
        self._check_u16("required_ring_helper_abi")


@dataclass(frozen=True, slots=True)
class ConfigureRole(WireStruct):
    """Configure role `role_id` with low-frequency metadata (spec §29)."""

    role_id: RoleId
    config: JsonValue


@dataclass(frozen=True, slots=True)
class InstallRing(WireStruct):
    """Install a leased ring in the worker (spec §29)."""

    ring_id: RingId
    edge_id: EdgeId
    port_id: PortId
    direction: RingDirection
    layout: RingLayout
    object_spec: ObjectSpec

    def _validate(self) -> None:
        if self.layout.ring_id != self.ring_id:
            raise PlanError("InstallRing", "layout.ring_id", "differs from ring_id")


@dataclass(frozen=True, slots=True)
class UninstallRing(WireStruct):
    """Remove a ring, wait out its copies, emit RingQuiesced (spec §29)."""

    ring_id: RingId
    reason: UninstallReason


@dataclass(frozen=True, slots=True)
class AwaitedInput(WireStruct):
    """A granted step's input: the object of `sequence` that ingress ring `ring_id`
    loads, bound to role input port `port_id` when it is loaded (module doc)."""

    port_id: PortId
    ring_id: RingId
    sequence: Sequence
    row_bytes: int
    """Bytes per row of the object, for outputs with `per_input_row`."""

    def _validate(self) -> None:
        self._check_range("row_bytes", 1, (1 << 64) - 1)


@dataclass(frozen=True, slots=True)
class OutputBinding(WireStruct):
    """An output object a step must write to an egress ring (spec §29)."""

    port_id: PortId
    ring_id: RingId
    object_id: ObjectId
    sequence: Sequence
    extent: int
    flags: int = 0
    per_input_row: bool = False
    """`extent` is bytes per row of the step's input (module doc)."""

    def _validate(self) -> None:
        self._check_u64("extent")
        self._check_u32("flags")


@dataclass(frozen=True, slots=True)
class GrantSteps(WireStruct):
    """Run one step per object of an ingress ring, in sequence order (module doc)."""

    role_id: RoleId
    first_step_id: StepId
    input: AwaitedInput
    """Step k awaits the object of sequence `input.sequence + k` on `input.ring_id`."""
    output: OutputBinding
    """Step k's output: this binding with object id and sequence advanced by k."""


@dataclass(frozen=True, slots=True)
class RevokeSteps(WireStruct):
    """End role `role_id`'s standing grant: no further step starts (module doc)."""

    role_id: RoleId


@dataclass(frozen=True, slots=True)
class ShutdownWorker(WireStruct):
    """Stop the worker (spec §29)."""

    mode: ShutdownMode


@dataclass(frozen=True, slots=True)
class ReleaseDeviceObject(WireStruct):
    """Free a device object once no compute or copy still references it (spec §29)."""

    device_handle: DeviceObjectHandle


@dataclass(frozen=True, slots=True)
class RingReadable(WireStruct):
    """Wake hint: `ring_id` may have new committed bytes; reload its cursors (spec §21)."""

    ring_id: RingId


@dataclass(frozen=True, slots=True)
class RingWritable(WireStruct):
    """Wake hint: `ring_id` may have new free space; reload its cursors (spec §21)."""

    ring_id: RingId


WorkerCommand = (
    InitializeWorker | ConfigureRole | InstallRing | UninstallRing | GrantSteps | RevokeSteps
    | ShutdownWorker
)

COMMAND_TYPES: dict[str, type[WireStruct]] = registry_of(
    *typing.get_args(WorkerCommand), ReleaseDeviceObject, RingReadable, RingWritable
)
"""What `decode_command` accepts: the commands and the node's stdin hints to the worker."""


def encode_command(command: WorkerCommand) -> str:
    """One control line (ending in a newline) for `command`."""
    return encode_line(command)


def decode_command(line: str | bytes) -> WorkerCommand:
    """Parse one stdin line; raise `ControlMessageError` or the body's `WireError`."""
    return typing.cast(WorkerCommand, decode_line(line, COMMAND_TYPES, "WorkerCommand"))
