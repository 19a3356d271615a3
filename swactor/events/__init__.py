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
"""

from __future__ import annotations

import argparse

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
    EventName,
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
from swactor.events.sinks import EVENT_LEVELS, JsonlSink, MemorySink, StderrSink, human_line
from swactor.events.wait import EventSource, EventTimeout, JsonlFollower, wait_for_event


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `swactor events` subcommand (see `swactor.events.cli`)."""
    from swactor.events.cli import register as register_cli

    register_cli(subparsers)


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
