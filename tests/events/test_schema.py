"""Every event round-trips through JSON Lines; the schema check rejects bad lines."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.events import (
    EVENT_CLASSES,
    FAULT_EVENTS,
    IDENTITY_TYPES,
    REQUIRED_FIELDS,
    REQUIRED_IDENTITIES,
    Emitted,
    EventName,
    EventSchemaError,
    NodeFaulted,
    ObjectLoaded,
    RunFaulted,
    RunTornDown,
    SchemaProblem,
    StageReady,
    TokenReceived,
    validate_line,
)
from swactor.wire import (
    Component,
    NodeId,
    ObjectFailure,
    RingFaultReason,
    RunFaultReason,
    RunId,
    RunOutcome,
    TeardownOutcome,
)

from .samples import IDS, required_kwargs, sample

# spec §40, transcribed independently of the code under test
SPEC_EVENTS = """
node_started node_available node_faulted pool_ready run_planned stage_provision_started
weights_download_started weights_downloaded weights_loaded edge_provision_started
edge_ready stage_ready readiness_barrier_passed prompt_injected object_loaded
execute_step_started object_produced step_completed token_received run_completed
run_faulted stop_run_sent stage_stopped run_torn_down
""".split()  # noqa: SIM905 (the spec's words, as it lists them)
SPEC_IDENTITIES = """
run_id node_id stage_index edge_id ring_id object_id sequence step_id worker_generation
""".split()  # noqa: SIM905


def stamp(event: Any) -> Emitted:
    return Emitted(event, mono=123_456_789, wall=1_790_000_000_123_456_789, pid=4242, proc="node")


def test_the_24_spec_events_and_9_identities_are_exactly_the_ones_defined() -> None:
    """The spec's 24 come first, in its order; any other is an extension docs/events.md
    lists under "Extensions beyond spec §40"."""
    assert [name.value for name in EventName][:len(SPEC_EVENTS)] == SPEC_EVENTS
    docs = (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text()
    _, _, extensions_doc = docs.partition("Extensions beyond spec §40")
    extensions = [name.value for name in EventName][len(SPEC_EVENTS):]
    assert [e for e in extensions if f"`{e}`" not in extensions_doc] == []
    assert set(EVENT_CLASSES) == set(EventName)
    assert sorted(IDENTITY_TYPES) == sorted(SPEC_IDENTITIES)
    assert set(REQUIRED_IDENTITIES) == set(EventName)


def test_each_class_requires_exactly_what_the_table_requires() -> None:
    for name, cls in EVENT_CLASSES.items():
        assert cls.NAME is name
        required = {
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        }
        assert required == REQUIRED_IDENTITIES[name] | REQUIRED_FIELDS.get(name, frozenset())
        assert required >= {"node_id"}


def test_fault_events_require_a_reason_and_the_detecting_component() -> None:
    assert {EventName.node_faulted, EventName.run_faulted} == FAULT_EVENTS
    for name in FAULT_EVENTS:
        assert REQUIRED_FIELDS[name] == {"reason", "component"}


@pytest.mark.parametrize("name", list(EventName), ids=lambda n: n.value)
def test_every_event_round_trips_through_a_json_line(name: EventName) -> None:
    emitted = stamp(sample(EVENT_CLASSES[name], detail={"extent": 2304, "note": "x"}))
    line = emitted.to_line()
    assert "\n" not in line
    data = json.loads(line)
    assert data["schema"] == 1 and data["event"] == name.value
    for identity in REQUIRED_IDENTITIES[name]:
        assert data[identity] == IDS[identity]
    back = validate_line(line)
    assert back == emitted
    assert type(back.event) is EVENT_CLASSES[name]


identity_values = st.fixed_dictionaries(
    {},
    optional={name: st.integers(0, 2**32 - 1) for name in IDENTITY_TYPES},
)
detail_values = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list(EventName)), identity_values, detail_values)
def test_any_valid_event_round_trips(
    name: EventName, ids: dict[str, int], detail: dict[str, Any]
) -> None:
    cls = EVENT_CLASSES[name]
    kwargs = {**required_kwargs(cls), **ids, "detail": detail}
    emitted = stamp(cls(**kwargs))
    assert validate_line(emitted.to_line()) == emitted


def test_fault_fields_round_trip_with_their_stable_values() -> None:
    fault = RunFaulted(
        node_id=NodeId(1), run_id=RunId(2), reason=RunFaultReason.ObjectHeaderMalformed,
        component=Component.IngressParser, cause=ObjectFailure.HeaderMalformed,
    )
    data = json.loads(stamp(fault).to_line())
    assert data["reason"] == "ObjectHeaderMalformed"
    assert data["component"] == "ingress_parser"
    assert data["cause"] == "ObjectFailure.HeaderMalformed"
    assert validate_line(json.dumps(data)).event == fault
    torn = RunTornDown(node_id=NodeId(1), run_id=RunId(2), outcome=RunOutcome.Completed,
                       teardown=TeardownOutcome.TimedOut)
    assert validate_line(stamp(torn).to_line()).event == torn


def _line_without(name: EventName, key: str) -> str:
    data = json.loads(stamp(sample(EVENT_CLASSES[name])).to_line())
    del data[key]
    return json.dumps(data)


@pytest.mark.parametrize(
    ("name", "identity"),
    [(name, identity) for name in EventName for identity in sorted(REQUIRED_IDENTITIES[name])],
    ids=lambda v: v.value if isinstance(v, EventName) else v,
)
def test_a_line_missing_a_required_identity_is_rejected(name: EventName, identity: str) -> None:
    with pytest.raises(EventSchemaError) as rejected:
        validate_line(_line_without(name, identity))
    assert rejected.value.problem is SchemaProblem.MissingIdentity
    assert rejected.value.field == identity
    data = json.loads(_line_without(name, identity))
    data[identity] = None
    with pytest.raises(EventSchemaError) as nulled:
        validate_line(json.dumps(data))
    assert nulled.value.problem is SchemaProblem.MissingIdentity


@pytest.mark.parametrize("key", ["reason", "component"])
def test_a_fault_line_without_reason_or_component_is_rejected(key: str) -> None:
    for name in FAULT_EVENTS:
        with pytest.raises(EventSchemaError) as rejected:
            validate_line(_line_without(name, key))
        assert rejected.value.problem is SchemaProblem.MissingField
        assert rejected.value.field == key


def _valid() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(stamp(sample(ObjectLoaded)).to_line())
    return data


@pytest.mark.parametrize(
    ("change", "problem", "field"),
    [
        ({"schema": 2}, SchemaProblem.SchemaVersion, "schema"),
        ({"schema": True}, SchemaProblem.SchemaVersion, "schema"),
        ({"event": "node_exploded"}, SchemaProblem.UnknownEvent, "event"),
        ({"payload": "x"}, SchemaProblem.UnknownField, "payload"),
        ({"token": 5}, SchemaProblem.UnknownField, "token"),  # not a field of object_loaded
        ({"run_id": "1"}, SchemaProblem.BadValue, "run_id"),
        ({"run_id": 1.0}, SchemaProblem.BadValue, "run_id"),
        ({"run_id": True}, SchemaProblem.BadValue, "run_id"),
        ({"run_id": -1}, SchemaProblem.BadValue, "run_id"),
        ({"stage_index": 2**32}, SchemaProblem.BadValue, "stage_index"),
        ({"mono": "now"}, SchemaProblem.BadValue, "mono"),
        ({"wall": None}, SchemaProblem.BadValue, "wall"),
        ({"proc": ""}, SchemaProblem.BadValue, "proc"),
        ({"detail": [1]}, SchemaProblem.BadValue, "detail"),
        ({"detail": {"x": [1, 2]}}, SchemaProblem.BadValue, "detail.x"),
    ],
)
def test_bad_lines_are_rejected_naming_the_problem(
    change: dict[str, Any], problem: SchemaProblem, field: str
) -> None:
    data = {**_valid(), **change}
    with pytest.raises(EventSchemaError) as rejected:
        validate_line(json.dumps(data))
    assert rejected.value.problem is problem
    assert rejected.value.field == field


def test_non_json_and_non_objects_are_rejected() -> None:
    cases: list[tuple[str | bytes, SchemaProblem]] = [
        ("{not json", SchemaProblem.NotJson),
        ("[1]", SchemaProblem.NotAnObject),
        (b"\xff\xfe", SchemaProblem.NotJson),
    ]
    for line, problem in cases:
        with pytest.raises(EventSchemaError) as rejected:
            validate_line(line)
        assert rejected.value.problem is problem


def test_fault_enums_are_checked_on_the_line() -> None:
    base = json.loads(stamp(sample(NodeFaulted)).to_line())
    for key, value in [("reason", "Meteor"), ("component", "toaster"),
                       ("cause", "RingFaultReason.Meteor"), ("cause", "Nope.HeaderMalformed"),
                       ("cause", "HeaderMalformed")]:
        with pytest.raises(EventSchemaError) as rejected:
            validate_line(json.dumps({**base, key: value}))
        assert rejected.value.problem is SchemaProblem.BadValue
        assert rejected.value.field == key


def test_payload_bytes_never_enter_an_event() -> None:
    for blob in (b"tensor", bytearray(b"x"), memoryview(b"y")):
        with pytest.raises(EventSchemaError) as rejected:
            sample(ObjectLoaded, detail={"payload": blob})
        assert rejected.value.problem is SchemaProblem.PayloadBytes
        assert rejected.value.field == "detail.payload"
    with pytest.raises(EventSchemaError) as as_identity:
        sample(ObjectLoaded, run_id=b"\x01")
    assert as_identity.value.problem is SchemaProblem.PayloadBytes


def test_stage_ready_footprint_round_trips_and_is_checked() -> None:
    ready = sample(StageReady, weights_bytes=97_000_000, kv_cache_bytes=2_949_120,
                   rss_bytes=175_000_000, file_bytes=96_600_000)
    data = json.loads(stamp(ready).to_line())
    assert (data["weights_bytes"], data["file_bytes"]) == (97_000_000, 96_600_000)
    assert validate_line(json.dumps(data)).event == ready
    assert "weights_bytes" not in stamp(sample(StageReady)).to_json()
    for bad in (-1, "1", 1.5, True):
        with pytest.raises(EventSchemaError) as rejected:
            validate_line(json.dumps({**data, "rss_bytes": bad}))
        assert rejected.value.field == "rss_bytes"
    with pytest.raises(EventSchemaError) as as_bytes:
        sample(StageReady, weights_bytes=b"\x01")
    assert as_bytes.value.problem is SchemaProblem.PayloadBytes


def test_records_check_their_values_at_construction() -> None:
    with pytest.raises(EventSchemaError) as missing:
        sample(ObjectLoaded, ring_id=None)
    assert missing.value.problem is SchemaProblem.MissingIdentity
    with pytest.raises(EventSchemaError):
        sample(RunFaulted, reason="WorkerCrashed")  # a str, not the enum
    with pytest.raises(EventSchemaError):
        sample(RunFaulted, cause=RunOutcome.Completed)  # not a §37 cause enum
    with pytest.raises(EventSchemaError):
        sample(TokenReceived, token=-1)
    plain = sample(ObjectLoaded, run_id=7)  # a plain int becomes the identifier type
    assert type(plain.run_id) is RunId
    assert sample(RunFaulted, cause=RingFaultReason.HeaderMalformed).to_json()["cause"] == (
        "RingFaultReason.HeaderMalformed"
    )
