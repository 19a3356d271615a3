"""Lifecycle events (spec §40): typed records, JSON Lines, sinks, a wait helper, a CLI.

Theory of operation. Components report progress by emitting typed records
(`ObjectLoaded(node_id=..., run_id=..., ...)`): `schema` defines the 24 events of spec
§40, which identities each requires, and the one-line JSON form with its schema check
(`validate_line`). An `Emitter` stamps each record with monotonic and wall time, pid and
process label, and writes it to its sinks (`sinks`: a size-rotated JSON Lines file per
process, short human lines on stderr, memory for tests). Tests wait for events with
`wait_for_event` (`wait`), never by scraping logs. `swactor events FILE...` (`cli`)
merges several processes' files by wall time and filters them, so an operator can follow
one run across machines.

Usage::

    from swactor.events import Emitter, MemorySink, ObjectLoaded, wait_for_event
    sink = MemorySink()
    events = Emitter("node", [sink])
    events.emit(ObjectLoaded(node_id=NodeId(7), run_id=RunId(1), stage_index=StageIndex(0),
                             edge_id=EdgeId(3), ring_id=RingId(5), object_id=ObjectId(9),
                             sequence=Sequence(0), worker_generation=WorkerGeneration(1)))
    hit = await wait_for_event(sink, 5.0, event="object_loaded", run_id=1, sequence=0)

Payload bytes never go into an event: bytes and memoryview values are rejected.

Names are loaded on first use (PEP 562), so that `swactor --help`, which imports this
package for `register`, does not pay for the schema and `swactor.wire`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from swactor.events.command import register

if TYPE_CHECKING:
    from swactor.events.emitter import (
        Emitter,
        Sink,
        add_event_arguments,
        configure,
        configure_from_args,
        default_emitter,
        emit,
        set_default_emitter,
    )
    from swactor.events.names import (
        EventName,
    )
    from swactor.events.schema import (
        CAUSE_ENUMS,
        EVENT_CLASSES,
        FAULT_EVENTS,
        IDENTITY_TYPES,
        REQUIRED_FIELDS,
        REQUIRED_IDENTITIES,
        SCHEMA_VERSION,
        EdgeProvisionStarted,
        EdgeReady,
        Emitted,
        EventSchemaError,
        ExecuteStepStarted,
        FaultEvent,
        LifecycleEvent,
        NodeAvailable,
        NodeFaulted,
        NodeStarted,
        ObjectLoaded,
        ObjectProduced,
        PoolReady,
        PromptInjected,
        ReadinessBarrierPassed,
        RunCompleted,
        RunFaulted,
        RunPlanned,
        RunTornDown,
        SchemaProblem,
        StageProvisionStarted,
        StageReady,
        StageStopped,
        StepCompleted,
        StopRunSent,
        TokenReceived,
        WeightsDownloaded,
        WeightsDownloadStarted,
        WeightsLoaded,
        from_json,
        validate_line,
    )
    from swactor.events.sinks import (
        EVENT_LEVELS,
        JsonlSink,
        MemorySink,
        StderrSink,
        human_line,
    )
    from swactor.events.wait import (
        EventSource,
        EventTimeout,
        JsonlFollower,
        wait_for_event,
    )

_MODULE_OF: dict[str, str] = {
    "Emitter": "swactor.events.emitter",
    "Sink": "swactor.events.emitter",
    "add_event_arguments": "swactor.events.emitter",
    "configure": "swactor.events.emitter",
    "configure_from_args": "swactor.events.emitter",
    "default_emitter": "swactor.events.emitter",
    "emit": "swactor.events.emitter",
    "set_default_emitter": "swactor.events.emitter",
    "EventName": "swactor.events.names",
    "CAUSE_ENUMS": "swactor.events.schema",
    "EVENT_CLASSES": "swactor.events.schema",
    "EdgeProvisionStarted": "swactor.events.schema",
    "EdgeReady": "swactor.events.schema",
    "Emitted": "swactor.events.schema",
    "EventSchemaError": "swactor.events.schema",
    "ExecuteStepStarted": "swactor.events.schema",
    "FAULT_EVENTS": "swactor.events.schema",
    "FaultEvent": "swactor.events.schema",
    "IDENTITY_TYPES": "swactor.events.schema",
    "LifecycleEvent": "swactor.events.schema",
    "NodeAvailable": "swactor.events.schema",
    "NodeFaulted": "swactor.events.schema",
    "NodeStarted": "swactor.events.schema",
    "ObjectLoaded": "swactor.events.schema",
    "ObjectProduced": "swactor.events.schema",
    "PoolReady": "swactor.events.schema",
    "PromptInjected": "swactor.events.schema",
    "REQUIRED_FIELDS": "swactor.events.schema",
    "REQUIRED_IDENTITIES": "swactor.events.schema",
    "ReadinessBarrierPassed": "swactor.events.schema",
    "RunCompleted": "swactor.events.schema",
    "RunFaulted": "swactor.events.schema",
    "RunPlanned": "swactor.events.schema",
    "RunTornDown": "swactor.events.schema",
    "SCHEMA_VERSION": "swactor.events.schema",
    "SchemaProblem": "swactor.events.schema",
    "StageProvisionStarted": "swactor.events.schema",
    "StageReady": "swactor.events.schema",
    "StageStopped": "swactor.events.schema",
    "StepCompleted": "swactor.events.schema",
    "StopRunSent": "swactor.events.schema",
    "TokenReceived": "swactor.events.schema",
    "WeightsDownloadStarted": "swactor.events.schema",
    "WeightsDownloaded": "swactor.events.schema",
    "WeightsLoaded": "swactor.events.schema",
    "from_json": "swactor.events.schema",
    "validate_line": "swactor.events.schema",
    "EVENT_LEVELS": "swactor.events.sinks",
    "JsonlSink": "swactor.events.sinks",
    "MemorySink": "swactor.events.sinks",
    "StderrSink": "swactor.events.sinks",
    "human_line": "swactor.events.sinks",
    "EventSource": "swactor.events.wait",
    "EventTimeout": "swactor.events.wait",
    "JsonlFollower": "swactor.events.wait",
    "wait_for_event": "swactor.events.wait",
}



def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'swactor.events' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CAUSE_ENUMS",
    "EVENT_CLASSES",
    "EVENT_LEVELS",
    "FAULT_EVENTS",
    "IDENTITY_TYPES",
    "REQUIRED_FIELDS",
    "REQUIRED_IDENTITIES",
    "SCHEMA_VERSION",
    "EdgeProvisionStarted",
    "EdgeReady",
    "Emitted",
    "Emitter",
    "EventName",
    "EventSchemaError",
    "EventSource",
    "EventTimeout",
    "ExecuteStepStarted",
    "FaultEvent",
    "JsonlFollower",
    "JsonlSink",
    "LifecycleEvent",
    "MemorySink",
    "NodeAvailable",
    "NodeFaulted",
    "NodeStarted",
    "ObjectLoaded",
    "ObjectProduced",
    "PoolReady",
    "PromptInjected",
    "ReadinessBarrierPassed",
    "RunCompleted",
    "RunFaulted",
    "RunPlanned",
    "RunTornDown",
    "SchemaProblem",
    "Sink",
    "StageProvisionStarted",
    "StageReady",
    "StageStopped",
    "StderrSink",
    "StepCompleted",
    "StopRunSent",
    "TokenReceived",
    "WeightsDownloadStarted",
    "WeightsDownloaded",
    "WeightsLoaded",
    "add_event_arguments",
    "configure",
    "configure_from_args",
    "default_emitter",
    "emit",
    "from_json",
    "human_line",
    "register",
    "set_default_emitter",
    "validate_line",
    "wait_for_event",
]
