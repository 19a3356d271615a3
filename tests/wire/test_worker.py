"""Worker command payloads (spec §29) and their newline-JSON control lines."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.testing.examples import example, strategy
from swactor.wire import (
    COMMAND_TYPES,
    EVENT_TYPES,
    ConfigureRole,
    ControlMessageError,
    DeviceObjectReleased,
    GrantSteps,
    InitializeWorker,
    InstallRing,
    InvalidFieldError,
    ObjectFailed,
    ObjectLoaded,
    ObjectProduced,
    OutputBinding,
    PlanError,
    PortId,
    ReleaseDeviceObject,
    ReleaseFailed,
    RevokeSteps,
    RingFault,
    RingId,
    RingInstalled,
    RingQuiesced,
    RingReadable,
    RingWritable,
    RoleConfigured,
    RoleFailed,
    Sequence,
    ShutdownMode,
    ShutdownWorker,
    StepCompleted,
    StepFailed,
    UninstallReason,
    UninstallRing,
    WireError,
    WorkerCommand,
    WorkerEvent,
    WorkerFatal,
    WorkerReady,
    WorkerStopped,
    decode_command,
    decode_event,
    encode_command,
    encode_event,
)

COMMANDS = [
    InitializeWorker,
    ConfigureRole,
    InstallRing,
    UninstallRing,
    GrantSteps,  # the standing step grant and its revocation, in place of §29's ExecuteStep
    RevokeSteps,
    ReleaseDeviceObject,
    RingReadable,
    RingWritable,
    ShutdownWorker,
]
# Spec §30 events, plus the two wake hints that travel both ways.
EVENTS = [
    WorkerReady,
    WorkerFatal,
    WorkerStopped,
    RoleConfigured,
    RoleFailed,
    RingInstalled,
    RingFault,
    RingQuiesced,
    ObjectLoaded,
    ObjectProduced,
    ObjectFailed,
    StepCompleted,
    StepFailed,
    DeviceObjectReleased,
    ReleaseFailed,
    RingReadable,
    RingWritable,
]


@pytest.mark.parametrize("tp", COMMANDS, ids=lambda t: t.__name__)
def test_command_lines_round_trip(tp: type[WorkerCommand]) -> None:
    command: WorkerCommand = example(tp)
    line = encode_command(command)
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["type"] == tp.__name__
    assert decode_command(line) == command
    assert decode_command(line.encode()) == command


def test_shutdown_line_is_exact() -> None:
    line = encode_command(ShutdownWorker(ShutdownMode.AbortInFlight))
    assert line == '{"type":"ShutdownWorker","body":{"mode":"AbortInFlight"}}\n'
    uninstall = encode_command(UninstallRing(RingId(4), UninstallReason.RingFaulted))
    assert uninstall == '{"type":"UninstallRing","body":{"ring_id":4,"reason":"RingFaulted"}}\n'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        (b'"\xc3\x28"', "not UTF-8 JSON"),
        ("[]", "expected an object {type, body}"),
        ('{"type":"ShutdownWorker"}', "expected an object {type, body}"),
        ('{"type":"ShutdownWorker","body":{},"x":1}', "expected an object {type, body}"),
        ('{"type":"Reboot","body":{}}', "unknown WorkerCommand type"),
        ('{"type":5,"body":{}}', "unknown WorkerCommand type"),
        ('{"type":"WorkerReady","body":{}}', "unknown WorkerCommand type"),
        ("[" * 100_000, "nests too deeply"),
        ("x" * ((1 << 20) + 1), "line longer than"),
    ],
)
def test_bad_control_lines(line: str | bytes, message: str) -> None:
    with pytest.raises(ControlMessageError, match=message):
        decode_command(line)


def test_bad_body_gives_the_body_error() -> None:
    with pytest.raises(WireError, match=r"ShutdownWorker\.mode: 'Later' is not a ShutdownMode"):
        decode_command('{"type":"ShutdownWorker","body":{"mode":"Later"}}')


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80) | st.binary(max_size=80))
def test_decode_fuzz_only_typed_errors(line: str | bytes) -> None:
    with contextlib.suppress(WireError):
        decode_command(line)


@settings(max_examples=30, deadline=None)
@given(strategy(GrantSteps))
def test_grant_lines_round_trip(grant: GrantSteps) -> None:
    assert decode_command(encode_command(grant)) == grant


def test_json_fields_reject_bytes_and_nan() -> None:
    with pytest.raises(WireError, match=r"ConfigureRole\.config: bytes is not JSON"):
        ConfigureRole(example(ConfigureRole).role_id, {"weights": b"\x00"})  # type: ignore[dict-item]
    with pytest.raises(InvalidFieldError, match="finite"):
        ConfigureRole(example(ConfigureRole).role_id, [float("nan")])
    with pytest.raises(WireError, match="keys must be str"):
        ConfigureRole(example(ConfigureRole).role_id, {1: 2})  # type: ignore[dict-item]


def test_command_rules() -> None:
    install = example(InstallRing)
    with pytest.raises(PlanError, match=r"InstallRing\.layout\.ring_id: differs from ring_id"):
        dataclasses.replace(install, ring_id=RingId(99))
    with pytest.raises(InvalidFieldError, match=r"InitializeWorker\.arena_ceiling"):
        dataclasses.replace(example(InitializeWorker), arena_ceiling=0)
    with pytest.raises(InvalidFieldError, match=r"InitializeWorker\.required_ring_helper_abi"):
        dataclasses.replace(example(InitializeWorker), required_ring_helper_abi=1 << 16)
    with pytest.raises(InvalidFieldError, match=r"OutputBinding\.flags"):
        dataclasses.replace(example(OutputBinding), flags=-1)
    with pytest.raises(InvalidFieldError, match=r"AwaitedInput\.row_bytes"):
        dataclasses.replace(example(GrantSteps).input, row_bytes=0)


def test_execute_step_is_no_command() -> None:
    """Steps run under standing grants only: a line naming §29's ExecuteStep is refused
    as an unknown command, like any other type the worker does not take."""
    line = ('{"type": "ExecuteStep", "body": {"role_id": 1, "step_id": 1, "inputs": [], '
            '"outputs": [], "runtime": null, "release_inputs_after": false}}')
    with pytest.raises(ControlMessageError, match="unknown WorkerCommand type"):
        decode_command(line)


def test_registries_are_exactly_the_spec_messages() -> None:
    assert set(COMMAND_TYPES.values()) == set(COMMANDS)
    assert set(EVENT_TYPES.values()) == set(EVENTS)


@pytest.mark.parametrize("tp", EVENTS, ids=lambda t: t.__name__)
def test_event_lines_round_trip(tp: type[WorkerEvent]) -> None:
    event: WorkerEvent = example(tp)
    line = encode_event(event)
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_event(line) == event


def test_event_line_is_exact_and_commands_are_not_events() -> None:
    failed = ObjectFailed(
        RingId(1),
        example(RingInstalled).edge_id,
        PortId(0),
        None,
        Sequence(4),
        example(ObjectFailed).reason,
    )
    assert encode_event(failed) == (
        '{"type":"ObjectFailed","body":{"ring_id":1,"edge_id":2,"port_id":0,'
        '"object_id":null,"sequence":4,"reason":"HeaderMalformed"}}\n'
    )
    with pytest.raises(ControlMessageError, match="unknown WorkerEvent type"):
        decode_event(encode_command(example(ShutdownWorker)))
    with pytest.raises(InvalidFieldError, match=r"WorkerReady\.pid: 0 is outside 1\.\."):
        dataclasses.replace(example(WorkerReady), pid=0)
    with pytest.raises(InvalidFieldError, match=r"ObjectLoaded\.extent"):
        dataclasses.replace(example(ObjectLoaded), extent=-1)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80) | st.binary(max_size=80))
def test_decode_event_fuzz_only_typed_errors(line: str | bytes) -> None:
    with contextlib.suppress(WireError):
        decode_event(line)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(EVENTS).flatmap(strategy), st.data())
def test_event_lines_with_a_mutated_body_give_typed_errors(
    event: WorkerEvent, data: st.DataObject
) -> None:
    document = json.loads(encode_event(event))
    body = document["body"]
    key = data.draw(st.sampled_from(sorted(body)))
    body[key] = data.draw(st.none() | st.integers() | st.text(max_size=5) | st.just([]))
    try:
        decoded = decode_event(json.dumps(document))
    except WireError:
        return
    assert type(decoded) is type(event)
