"""The lifecycle event schema (spec §40): names, identity tables, typed records, one line.

Theory of operation. Each of the 24 lifecycle events of spec §40 is a frozen dataclass
(`NodeStarted` ... `RunTornDown`) whose `NAME` is its `EventName`. Every record may carry
any of the nine §40 identities (run_id, node_id, stage_index, edge_id, ring_id,
object_id, sequence, step_id, worker_generation); the ones an event *requires* are listed
in `REQUIRED_IDENTITIES` (the contract) and are required constructor arguments of its
class. Fault events (`node_faulted`, `run_faulted`) also require a stable `reason` (a
`swactor.wire.RunFaultReason`) and the `component` (`swactor.wire.Component`) that
detected the fault, and may name a finer §37 `cause` (e.g. `RingFaultReason.HeaderMalformed`).
`detail` holds a few extra JSON scalars (counts, sizes, names); bytes and memoryviews are
rejected there and everywhere else: payload never goes into an event.

On the wire an event is one JSON object on one line (`Emitted.to_line()`):

    {"schema": 1, "event": "object_loaded", "mono": ..., "wall": ..., "pid": 4242,
     "proc": "node", "node_id": 7, "run_id": 1, ..., "detail": {"extent": 2304}}

`mono` is `time.monotonic_ns()` of the emitting process (for intervals within one
process), `wall` is `time.time_ns()` (for merging several processes' files). Identities
that are None are left out. `validate_line` is the schema check: it parses one line and
returns the `Emitted` record, or raises `EventSchemaError` whose `problem` names what is
wrong (unknown schema version, unknown event, a missing required identity, an unknown
key, a value of the wrong type, bytes).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from swactor.events.names import EventName
from swactor.wire import (
    ArenaFailure,
    Component,
    EdgeId,
    NodeId,
    ObjectFailure,
    ObjectId,
    ReleaseFailure,
    RingFaultReason,
    RingId,
    RoleFailure,
    RunFaultReason,
    RunId,
    RunOutcome,
    Sequence,
    StageIndex,
    StepFailure,
    StepId,
    StreamFaultReason,
    TeardownOutcome,
    WorkerFatalReason,
    WorkerGeneration,
)
from swactor.wire.errors import WireError

SCHEMA_VERSION = 1

Scalar = str | int | float | bool | None


IDENTITY_TYPES: Mapping[str, type[int]] = {
    "run_id": RunId,
    "node_id": NodeId,
    "stage_index": StageIndex,
    "edge_id": EdgeId,
    "ring_id": RingId,
    "object_id": ObjectId,
    "sequence": Sequence,
    "step_id": StepId,
    "worker_generation": WorkerGeneration,
}
"""The nine identities of spec §40 and their `swactor.wire` types."""

_E = EventName
_RUN = ("node_id", "run_id")
_STAGE = (*_RUN, "stage_index")
_OBJECT = ("edge_id", "ring_id", "object_id", "sequence")
_STEP = ("step_id", "sequence", "worker_generation")

REQUIRED_IDENTITIES: Mapping[EventName, frozenset[str]] = {
    name: frozenset(ids)
    for name, ids in {
        _E.node_started: ("node_id",),
        _E.node_available: ("node_id",),
        _E.node_faulted: ("node_id",),
        _E.pool_ready: ("node_id",),
        _E.run_planned: _RUN,
        _E.stage_provision_started: _STAGE,
        _E.weights_download_started: _STAGE,
        _E.weights_downloaded: _STAGE,
        _E.weights_loaded: (*_STAGE, "worker_generation"),
        _E.edge_provision_started: (*_RUN, "edge_id"),
        _E.edge_ready: (*_RUN, "edge_id", "ring_id"),
        _E.stage_ready: (*_STAGE, "worker_generation"),
        _E.readiness_barrier_passed: _RUN,
        _E.prompt_injected: (*_RUN, "edge_id", "object_id", "sequence"),
        _E.object_loaded: (*_STAGE, *_OBJECT, "worker_generation"),
        _E.execute_step_started: (*_STAGE, *_STEP),
        _E.object_produced: (*_STAGE, *_OBJECT, *_STEP),
        _E.step_completed: (*_STAGE, *_STEP),
        _E.token_received: (*_RUN, "edge_id", "object_id", "sequence"),
        _E.run_completed: _RUN,
        _E.run_faulted: _RUN,
        _E.stop_run_sent: _STAGE,
        _E.stage_stopped: _STAGE,
        _E.run_torn_down: _RUN,
        # extensions beyond spec §40: the serving session (the orchestrator's node id)
        _E.serve_started: ("node_id",),
        _E.serve_recovery_started: ("node_id",),
        _E.serve_recovery_completed: ("node_id",),
        _E.serve_stopped: ("node_id",),
        _E.serve_failed: ("node_id",),
        _E.sequence_migrated: ("node_id",),
        _E.sequence_lost: ("node_id",),
        _E.spare_preloaded: ("node_id",),
        _E.spare_preload_failed: ("node_id",),
        # extensions beyond spec §40: the sequences of a serving run
        _E.sequence_started: _RUN,
        _E.sequence_first_token: _RUN,
        _E.sequence_finished: _RUN,
        _E.sequence_failed: _RUN,
    }.items()
}
"""Which identities each event must carry (the contract `validate_line` enforces)."""

REQUIRED_FIELDS: Mapping[EventName, frozenset[str]] = {
    _E.node_faulted: frozenset({"reason", "component"}),
    _E.run_faulted: frozenset({"reason", "component"}),
    _E.run_torn_down: frozenset({"outcome", "teardown"}),
}
"""Non-identity fields an event must carry: a fault's reason and component, outcomes."""

BYTE_COUNT_FIELDS = frozenset({"weights_bytes", "kv_cache_bytes", "rss_bytes", "file_bytes"})
"""Size fields (non-negative ints; extension beyond spec §40: stage_ready's footprint)."""

FLAG_FIELDS = frozenset({"role_reused"})
"""Yes/no fields (extension beyond spec §40: stage_ready's role_reused)."""

FAULT_EVENTS = frozenset({_E.node_faulted, _E.run_faulted})

CAUSE_ENUMS: Mapping[str, type[enum.Enum]] = {
    cls.__name__: cls
    for cls in (
        RingFaultReason,
        ObjectFailure,
        StepFailure,
        WorkerFatalReason,
        StreamFaultReason,
        RoleFailure,
        ReleaseFailure,
        ArenaFailure,
    )
}
"""Enums whose members may be named as a fault's finer `cause` ("EnumName.Member")."""

ENVELOPE_KEYS = ("schema", "event", "mono", "wall", "pid", "proc")


class SchemaProblem(enum.Enum):
    """What is wrong with an event or an event line."""

    NotJson = "NotJson"
    NotAnObject = "NotAnObject"
    SchemaVersion = "SchemaVersion"
    UnknownEvent = "UnknownEvent"
    MissingIdentity = "MissingIdentity"
    MissingField = "MissingField"
    UnknownField = "UnknownField"
    BadValue = "BadValue"
    PayloadBytes = "PayloadBytes"


class EventSchemaError(ValueError):
    """An event or line breaks the schema; `problem` and `field` say how and where."""

    def __init__(self, problem: SchemaProblem, event: str, field: str, rule: str) -> None:
        super().__init__(f"{event or '?'}: {field or '-'}: {problem.value}: {rule}")
        self.problem = problem
        self.event = event
        self.field = field


# ------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleEvent:
    """Base of the 24 event records: every identity optional, plus `detail`."""

    NAME: ClassVar[EventName]

    node_id: NodeId | None = None
    run_id: RunId | None = None
    stage_index: StageIndex | None = None
    edge_id: EdgeId | None = None
    ring_id: RingId | None = None
    object_id: ObjectId | None = None
    sequence: Sequence | None = None
    step_id: StepId | None = None
    worker_generation: WorkerGeneration | None = None
    detail: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.NAME.value
        for key in _field_names(type(self)):
            value = getattr(self, key)
            if value is None:
                if key in REQUIRED_IDENTITIES[self.NAME]:
                    raise EventSchemaError(
                        SchemaProblem.MissingIdentity, name, key, "required identity is None"
                    )
                if key in REQUIRED_FIELDS.get(self.NAME, ()):
                    raise EventSchemaError(SchemaProblem.MissingField, name, key, "is None")
                continue
            object.__setattr__(self, key, _coerce(name, key, value))

    def to_json(self) -> dict[str, Any]:
        """The record's fields as JSON values (None fields and empty detail left out)."""
        out: dict[str, Any] = {}
        for key in _field_names(type(self)):
            value = getattr(self, key)
            if value is not None and key != "detail":
                out[key] = _to_json_value(value)
        if self.detail:
            out["detail"] = dict(self.detail)  # last: identities and reasons read first
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultEvent(LifecycleEvent):
    """A fault: the stable reason, the component that detected it, an optional cause."""

    reason: RunFaultReason
    component: Component
    cause: enum.Enum | None = None
    """A finer spec §37 reason (any enum of `CAUSE_ENUMS`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _NodeEvent(LifecycleEvent):
    """An event that must name its node (the identity groups mirror REQUIRED_IDENTITIES)."""

    node_id: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class _RunEvent(_NodeEvent):
    run_id: RunId


@dataclass(frozen=True, slots=True, kw_only=True)
class _StageEvent(_RunEvent):
    stage_index: StageIndex


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepEvent(_StageEvent):
    step_id: StepId
    sequence: Sequence
    worker_generation: WorkerGeneration


@dataclass(frozen=True, slots=True, kw_only=True)
class _EdgeObjectEvent(_RunEvent):
    """An object at the orchestrator's end of a token edge (no ring, no stage)."""

    edge_id: EdgeId
    object_id: ObjectId
    sequence: Sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStarted(_NodeEvent):
    NAME = EventName.node_started


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAvailable(_NodeEvent):
    NAME = EventName.node_available


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFaulted(FaultEvent):
    NAME = EventName.node_faulted
    node_id: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolReady(_NodeEvent):
    NAME = EventName.pool_ready


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlanned(_RunEvent):
    NAME = EventName.run_planned


@dataclass(frozen=True, slots=True, kw_only=True)
class StageProvisionStarted(_StageEvent):
    NAME = EventName.stage_provision_started


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsDownloadStarted(_StageEvent):
    NAME = EventName.weights_download_started


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsDownloaded(_StageEvent):
    NAME = EventName.weights_downloaded


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsLoaded(_StageEvent):
    NAME = EventName.weights_loaded
    worker_generation: WorkerGeneration


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeProvisionStarted(_RunEvent):
    NAME = EventName.edge_provision_started
    edge_id: EdgeId


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeReady(_RunEvent):
    NAME = EventName.edge_ready
    edge_id: EdgeId
    ring_id: RingId


@dataclass(frozen=True, slots=True, kw_only=True)
class StageReady(_StageEvent):
    """The stage passed its setup barrier. The byte counts are an extension beyond spec
    §40, present when the worker's role holds a model: weights and KV cache as held, the
    worker's resident set at ready, and its layer range's tensor bytes in the file.
    `role_reused` (extension too): the worker served the stage with the role it already
    held for the same range of the same file (kept from the node's previous run, or
    preloaded on a warm spare), so nothing was loaded."""

    NAME = EventName.stage_ready
    worker_generation: WorkerGeneration
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    rss_bytes: int | None = None
    file_bytes: int | None = None
    role_reused: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadinessBarrierPassed(_RunEvent):
    NAME = EventName.readiness_barrier_passed


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptInjected(_EdgeObjectEvent):
    NAME = EventName.prompt_injected


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectLoaded(_StageEvent):
    NAME = EventName.object_loaded
    edge_id: EdgeId
    ring_id: RingId
    object_id: ObjectId
    sequence: Sequence
    worker_generation: WorkerGeneration


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteStepStarted(_StepEvent):
    NAME = EventName.execute_step_started


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectProduced(_StepEvent):
    NAME = EventName.object_produced
    edge_id: EdgeId
    ring_id: RingId
    object_id: ObjectId


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCompleted(_StepEvent):
    NAME = EventName.step_completed


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenReceived(_EdgeObjectEvent):
    NAME = EventName.token_received
    token: int | None = None
    """The sampled token id (a vocabulary index, not payload bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted(_RunEvent):
    NAME = EventName.run_completed


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFaulted(FaultEvent):
    NAME = EventName.run_faulted
    node_id: NodeId
    run_id: RunId


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRunSent(_StageEvent):
    NAME = EventName.stop_run_sent


@dataclass(frozen=True, slots=True, kw_only=True)
class StageStopped(_StageEvent):
    NAME = EventName.stage_stopped


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTornDown(_RunEvent):
    NAME = EventName.run_torn_down
    outcome: RunOutcome
    teardown: TeardownOutcome


# Extensions beyond spec §40: the serving session (fsm/serve_session.yaml). Each names the
# orchestrator (node_id) and, where there is one, the run it is about (run_id); `detail`
# carries the words (`reason`) and counts (`restarts`).


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeStarted(_NodeEvent):
    """The session's first run serves (detail: slots)."""

    NAME = EventName.serve_started


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRecoveryStarted(_NodeEvent):
    """The current run faulted; the session tears it down and provisions a new one."""

    NAME = EventName.serve_recovery_started


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRecoveryCompleted(_NodeEvent):
    """A new run serves after a fault (detail: restarts)."""

    NAME = EventName.serve_recovery_completed


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeStopped(_NodeEvent):
    """The operator stopped the session; nothing runs."""

    NAME = EventName.serve_stopped


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeFailed(_NodeEvent):
    """The session gave up (detail: reason); nothing runs."""

    NAME = EventName.serve_failed


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceMigrated(_NodeEvent):
    """A sequence the faulted run ended was handed to the new run (run_id) as a
    continuation (detail: sequence_id, from_run, prompt_tokens, streamed_tokens,
    migrations)."""

    NAME = EventName.sequence_migrated


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceLost(_NodeEvent):
    """A sequence the faulted run ended could not be migrated (detail: sequence_id, reason:
    the fault, why: why it did not move, streamed_tokens)."""

    NAME = EventName.sequence_lost


@dataclass(frozen=True, slots=True, kw_only=True)
class SparePreloaded(_NodeEvent):
    """A spare node holds a stage role of the current run's plan, preloaded (detail:
    spare, stage_index, layers, seconds, reused: it held the role already)."""

    NAME = EventName.spare_preloaded


@dataclass(frozen=True, slots=True, kw_only=True)
class SparePreloadFailed(_NodeEvent):
    """A spare node could not preload a stage role (detail: spare, stage_index, layers,
    why); it stays cold for that range."""

    NAME = EventName.spare_preload_failed


# Extensions beyond spec §40: the sequences of a serving run (fsm/sequence.yaml). Each names
# the orchestrator and the run; `detail` carries the serving sequence id and the rest.


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceStarted(_RunEvent):
    """A serving sequence was bound a KV slot (detail: sequence_id, slot, prompt_tokens)."""

    NAME = EventName.sequence_started


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceFirstToken(_RunEvent):
    """A serving sequence's first token was accepted (detail: sequence_id, ttft_s)."""

    NAME = EventName.sequence_first_token


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceFinished(_RunEvent):
    """A serving sequence ended (detail: sequence_id, reason stop / length / cancelled,
    tokens)."""

    NAME = EventName.sequence_finished


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceFailed(_RunEvent):
    """A serving sequence ended with an error (detail: sequence_id, error, tokens)."""

    NAME = EventName.sequence_failed


EVENT_CLASSES: Mapping[EventName, type[LifecycleEvent]] = {
    cls.NAME: cls
    for cls in (
        NodeStarted, NodeAvailable, NodeFaulted, PoolReady, RunPlanned,
        StageProvisionStarted, WeightsDownloadStarted, WeightsDownloaded, WeightsLoaded,
        EdgeProvisionStarted, EdgeReady, StageReady, ReadinessBarrierPassed,
        PromptInjected, ObjectLoaded, ExecuteStepStarted, ObjectProduced, StepCompleted,
        TokenReceived, RunCompleted, RunFaulted, StopRunSent, StageStopped, RunTornDown,
        ServeStarted, ServeRecoveryStarted, ServeRecoveryCompleted, ServeStopped, ServeFailed,
        SequenceMigrated, SequenceLost, SparePreloaded, SparePreloadFailed,
        SequenceStarted, SequenceFirstToken, SequenceFinished, SequenceFailed,
    )
}


# ------------------------------------------------------------- the one line


@dataclass(frozen=True, slots=True)
class Emitted:
    """An event as emitted: the record plus where and when."""

    event: LifecycleEvent
    mono: int
    """time.monotonic_ns() in the emitting process."""
    wall: int
    """time.time_ns() in the emitting process."""
    pid: int
    proc: str
    """What the emitting process is: "node", "orchestrator", "worker", ..."""

    @property
    def name(self) -> EventName:
        return self.event.NAME

    def to_json(self) -> dict[str, Any]:
        head: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "event": self.event.NAME.value,
            "mono": self.mono,
            "wall": self.wall,
            "pid": self.pid,
            "proc": self.proc,
        }
        head.update(self.event.to_json())
        return head

    def to_line(self) -> str:
        """One JSON line, without the newline."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)

    def value(self, key: str) -> Any:
        """A field by name, as its JSON value (for matching): envelope or record field."""
        if key == "event":
            return self.event.NAME.value
        if key in ("mono", "wall", "pid", "proc"):
            return getattr(self, key)
        if key in _field_names(type(self.event)):
            raw = getattr(self.event, key)
            return None if raw is None else _to_json_value(raw)
        raise KeyError(key)


def validate_line(line: str | bytes) -> Emitted:
    """Parse and check one event line; EventSchemaError names what is wrong."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise EventSchemaError(SchemaProblem.NotJson, "", "", str(error)) from None
    return from_json(data)


def from_json(data: object) -> Emitted:
    """Check one decoded event object; EventSchemaError names what is wrong."""
    if not isinstance(data, dict):
        raise EventSchemaError(SchemaProblem.NotAnObject, "", "", type(data).__name__)
    event_value = data.get("event")
    event_text = event_value if isinstance(event_value, str) else ""
    schema = data.get("schema")
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        raise EventSchemaError(
            SchemaProblem.SchemaVersion, event_text, "schema",
            f"expected {SCHEMA_VERSION}, got {schema!r}",
        )
    try:
        name = EventName(event_value)
    except ValueError:
        raise EventSchemaError(
            SchemaProblem.UnknownEvent, event_text, "event", f"{event_value!r} is not an event"
        ) from None
    cls = EVENT_CLASSES[name]
    allowed = set(_field_names(cls))
    for key in data:
        if key not in allowed and key not in ENVELOPE_KEYS:
            raise EventSchemaError(SchemaProblem.UnknownField, name.value, key, "unknown key")
    for key in sorted(REQUIRED_IDENTITIES[name]):
        if data.get(key) is None:
            raise EventSchemaError(
                SchemaProblem.MissingIdentity, name.value, key, "required identity missing"
            )
    for key in sorted(REQUIRED_FIELDS.get(name, ())):
        if data.get(key) is None:
            raise EventSchemaError(SchemaProblem.MissingField, name.value, key, "missing")
    mono = _envelope_int(data, "mono", name)
    wall = _envelope_int(data, "wall", name)
    pid = _envelope_int(data, "pid", name)
    proc = data.get("proc")
    if not isinstance(proc, str) or not proc:
        raise _bad(name.value, "proc", "must be a non-empty str")
    kwargs: dict[str, Any] = {
        key: _from_json_value(name.value, key, data[key]) for key in allowed if key in data
    }
    try:
        record = cls(**kwargs)
    except TypeError as error:
        raise EventSchemaError(SchemaProblem.MissingField, name.value, "", str(error)) from None
    return Emitted(record, mono, wall, pid, proc)


# ------------------------------------------------------------------ helpers

_FIELD_NAMES: dict[type[LifecycleEvent], tuple[str, ...]] = {}


def _field_names(cls: type[LifecycleEvent]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


_ENUM_FIELDS: Mapping[str, type[enum.Enum]] = {
    "reason": RunFaultReason,
    "component": Component,
    "outcome": RunOutcome,
    "teardown": TeardownOutcome,
}


def _bad(event: str, key: str, rule: str) -> EventSchemaError:
    return EventSchemaError(SchemaProblem.BadValue, event, key, rule)


def _coerce(event: str, key: str, value: object) -> object:
    """Check (and normalise) one record field value at construction."""
    if type(value) is IDENTITY_TYPES.get(key):
        return value  # already the identifier type, range-checked when it was made
    if isinstance(value, bytes | bytearray | memoryview):
        raise EventSchemaError(SchemaProblem.PayloadBytes, event, key, "bytes never go in events")
    if key in IDENTITY_TYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(event, key, f"must be an int, not {type(value).__name__}")
        try:
            return IDENTITY_TYPES[key](value)
        except WireError as error:
            raise _bad(event, key, str(error)) from None
    if key in _ENUM_FIELDS:
        if not isinstance(value, _ENUM_FIELDS[key]):
            raise _bad(event, key, f"must be a {_ENUM_FIELDS[key].__name__}")
        return value
    if key == "cause":
        if not isinstance(value, enum.Enum) or CAUSE_ENUMS.get(type(value).__name__) is not type(
            value
        ):
            raise _bad(event, key, f"must be a member of one of {sorted(CAUSE_ENUMS)}")
        return value
    if key == "token" or key in BYTE_COUNT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(event, key, "must be a non-negative int")
        return int(value)
    if key in FLAG_FIELDS:
        if not isinstance(value, bool):
            raise _bad(event, key, "must be a bool")
        return value
    if key == "detail":
        return _check_detail(event, value)
    raise _bad(event, key, "no codec for this field")  # a record field without a rule


def _check_detail(event: str, value: object) -> Mapping[str, Scalar]:
    if not isinstance(value, Mapping):
        raise _bad(event, "detail", "must be a mapping of str to JSON scalars")
    checked: dict[str, Scalar] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _bad(event, "detail", "keys must be str")
        if isinstance(item, bytes | bytearray | memoryview):
            raise EventSchemaError(
                SchemaProblem.PayloadBytes, event, f"detail.{key}", "bytes never go in events"
            )
        if isinstance(item, float) and not math.isfinite(item):
            raise _bad(event, f"detail.{key}", "floats must be finite")
        if item is not None and not isinstance(item, str | int | float | bool):
            raise _bad(event, f"detail.{key}", f"{type(item).__name__} is not a JSON scalar")
        checked[key] = item
    return checked


def _to_json_value(value: object) -> Any:
    if isinstance(value, enum.Enum):
        if isinstance(value, RunFaultReason | Component | RunOutcome | TeardownOutcome):
            return value.value
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def _from_json_value(event: str, key: str, value: object) -> object:
    """Turn one JSON value back into the record field's type (checked again by the class)."""
    if key in _ENUM_FIELDS:
        enum_cls = _ENUM_FIELDS[key]
        try:
            return enum_cls(value)
        except ValueError:
            raise _bad(event, key, f"{value!r} is not a {enum_cls.__name__}") from None
    if key == "cause":
        if not isinstance(value, str) or "." not in value:
            raise _bad(event, key, "must read 'EnumName.Member'")
        enum_name, member = value.split(".", 1)
        cause_cls = CAUSE_ENUMS.get(enum_name)
        if cause_cls is None or member not in cause_cls.__members__:
            raise _bad(event, key, f"{value!r} names no member of {sorted(CAUSE_ENUMS)}")
        return cause_cls[member]
    if key == "detail" and not isinstance(value, dict):
        raise _bad(event, key, "must be a JSON object")
    if isinstance(value, float) and key in IDENTITY_TYPES:
        raise _bad(event, key, "must be an integer")
    return value


def _envelope_int(data: Mapping[str, object], key: str, name: EventName) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventSchemaError(SchemaProblem.BadValue, name.value, key, "must be an int >= 0")
    return value
