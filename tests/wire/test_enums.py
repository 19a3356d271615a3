"""The spec §37/§29/§18/§11 enums carry exactly the spec's members, by name and value."""

from __future__ import annotations

import enum

import pytest

import swactor.wire as wire

# Transcribed from spec §11, §18, §29, §37, §38 (not from the code under test).
SPEC_MEMBERS: dict[str, list[str]] = {
    "EdgeKind": ["TokenIn", "Activation", "TokenOut"],
    "RingDirection": ["Ingress", "Egress"],
    "HostPinning": ["Pageable", "PinnedRequired"],
    "WakeCoalescing": ["PendingBit", "ReadySet"],
    "RingFaultReason": [
        "UnsupportedRingVersion",
        "RingLayoutInvalid",
        "RingStateInvalid",
        "DeviceOutOfMemory",
        "DeviceCopyFailed",
        "SequenceViolation",
        "HeaderMalformed",
        "WorkerProcessExited",
        "WorkerShuttingDown",
        "WorkerInternal",
    ],
    "ObjectFailure": [
        "HeaderMalformed",
        "UnsupportedObjectVersion",
        "ExtentExceedsMax",
        "ExtentAlignmentInvalid",
        "SequenceViolation",
        "DeviceAllocationFailed",
        "DeviceCopyFailed",
        "EofMidObject",
    ],
    "StepFailure": [
        "RoleUnavailable",
        "InvalidInputHandle",
        "InvalidOutputRing",
        "TinygradError",
        "DeviceOutOfMemory",
        "OutputExtentInvalid",
        "OutputCopyFailed",
        "WorkerProcessExited",
        "WorkerShuttingDown",
    ],
    "WorkerFatalReason": [
        "ArenaMapFailed",
        "RingHelperAbiMismatch",
        "BackendInitFailed",
        "MalformedControlMessage",
        "UnhandledException",
    ],
    "UninstallReason": ["EdgeStopped", "RingFaulted", "WorkerShutdown"],
    "WorkerStoppedReason": ["Graceful", "AbortInFlight", "Fatal"],
    "ShutdownMode": ["Graceful", "AbortInFlight"],
    "RunOutcome": ["Completed", "Faulted", "OperatorStopped"],
    "TeardownOutcome": ["Clean", "Faulted", "TimedOut"],
}


@pytest.mark.parametrize("name", sorted(SPEC_MEMBERS))
def test_spec_enum_members_exact(name: str) -> None:
    tp = getattr(wire, name)
    assert [m.name for m in tp] == SPEC_MEMBERS[name]
    assert [m.value for m in tp] == SPEC_MEMBERS[name]


def test_run_fault_reason_covers_every_section_36_source() -> None:
    # One member per §36 bullet, in the spec's order, then the orchestrator's timeouts
    # (§13: no readiness in time; no output for the running step in time).
    section_36 = [
        "NodeUnavailable",  # node unavailable before or during run
        "MembershipLost",  # membership loss for a required node
        "ProvisioningRejected",
        "ArenaBootFailed",
        "RingRequestOversized",  # oversized ring request
        "ArenaPressureTimeout",  # temporary pressure timeout
        "WeightDownloadFailed",
        "WeightLoadFailed",
        "WeightBindFailed",
        "EdgeEstablishmentFailed",
        "ObjectHeaderMalformed",
        "EofMidObject",
        "StreamFault",
        "PumpFailed",
        "RingFault",
        "WorkerFatal",
        "WorkerCrashed",
        "DeviceOutOfMemory",
        "DeviceCopyFailed",
        "SequenceViolation",  # inference-step ordering violation
        "StepFailed",
        "ReadinessTimeout",
        "ProgressTimeout",
    ]
    assert [m.name for m in wire.RunFaultReason] == section_36


def test_component_values_are_snake_case_event_names() -> None:
    assert wire.Component.ArenaManager.value == "arena_manager"
    assert wire.Component("recv_pump") is wire.Component.RecvPump
    for member in wire.Component:
        assert member.value == member.value.lower() and " " not in member.value
    required = {
        "orchestrator",
        "stage_controller",
        "arena_manager",
        "edge_establisher",
        "driver",
        "recv_pump",
        "send_pump",
        "worker_ctl",
        "worker",
        "membership",
        "planner",
    }
    assert required <= {m.value for m in wire.Component}


def test_arena_failure_members() -> None:
    assert {m.name for m in wire.ArenaFailure} == {
        "MemfdFailed",
        "TruncateFailed",
        "MmapFailed",
        "SealFailed",
        "LeaseNeverFits",
        "ShuttingDown",
        "PressureTimeout",
    }


def test_every_exported_enum_has_unique_string_values() -> None:
    enums = [v for v in vars(wire).values() if isinstance(v, type) and issubclass(v, enum.Enum)]
    assert len(enums) >= 30
    for tp in enums:
        values = [m.value for m in tp]
        assert all(isinstance(v, str) for v in values), tp
        assert len(set(values)) == len(values), tp
        if tp is not wire.Component:
            assert values == [m.name for m in tp], tp
