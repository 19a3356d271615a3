"""Identifier newtypes: ranges, reprs, type strictness, JSON behaviour."""

from __future__ import annotations

import pytest

from swactor.wire import (
    DeviceObjectHandle,
    EdgeId,
    FieldTypeError,
    IdentifierRangeError,
    JsonShapeError,
    LeaseRequestId,
    NodeId,
    ObjectId,
    PortId,
    RingId,
    RoleId,
    RunId,
    Sequence,
    StageIndex,
    StepId,
    WireError,
    WorkerGeneration,
)

U64_IDS = [
    RunId,
    NodeId,
    RoleId,
    EdgeId,
    RingId,
    ObjectId,
    Sequence,
    StepId,
    WorkerGeneration,
    PortId,
    LeaseRequestId,
]


@pytest.mark.parametrize("tp", U64_IDS)
def test_u64_bounds(tp: type[int]) -> None:
    assert tp(0) == 0
    assert tp(2**64 - 1) == 18446744073709551615
    with pytest.raises(IdentifierRangeError, match=r"outside 0\.\.18446744073709551615"):
        tp(2**64)
    with pytest.raises(IdentifierRangeError):
        tp(-1)


def test_stage_index_is_u32() -> None:
    assert StageIndex(4294967295) == 4294967295
    with pytest.raises(IdentifierRangeError, match=r"StageIndex\.value: 4294967296 is outside"):
        StageIndex(4294967296)


@pytest.mark.parametrize("bad", [True, 1.0, "3", None])
def test_identifiers_reject_non_int(bad: object) -> None:
    with pytest.raises(FieldTypeError, match="must be an int"):
        EdgeId(bad)  # type: ignore[arg-type]


def test_repr_str_and_arithmetic() -> None:
    edge = EdgeId(3)
    assert repr(edge) == "EdgeId(3)"
    assert str(edge) == "3"
    assert f"{edge}" == "3"
    assert type(edge + 1) is int
    assert EdgeId(3) == 3 and hash(EdgeId(3)) == hash(3)
    assert isinstance(RingId(5), int)


def test_errors_are_value_errors_naming_type_field_rule() -> None:
    with pytest.raises(ValueError, match="RingId") as info:
        RingId(-5)
    err = info.value
    assert isinstance(err, WireError)
    assert (err.type_name, err.field) == ("RingId", "value")
    assert "-5" in err.rule


def test_device_handle_coerces_and_round_trips() -> None:
    handle = DeviceObjectHandle(1, 2**64 - 1)  # type: ignore[arg-type]
    assert type(handle.worker_generation) is WorkerGeneration
    assert handle.to_json() == {"worker_generation": 1, "id": 18446744073709551615}
    assert DeviceObjectHandle.from_json(handle.to_json()) == handle
    with pytest.raises(IdentifierRangeError, match=r"DeviceObjectHandle\.worker_generation"):
        DeviceObjectHandle(-1, 0)  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"DeviceObjectHandle\.id"):
        DeviceObjectHandle(WorkerGeneration(1), 2**64)
    with pytest.raises(JsonShapeError, match=r"missing keys \['id'\]"):
        DeviceObjectHandle.from_json({"worker_generation": 1})
    with pytest.raises(FieldTypeError, match=r"DeviceObjectHandle\.id: expected int, got str"):
        DeviceObjectHandle.from_json({"worker_generation": 1, "id": "2"})


def test_identifier_kinds_do_not_mix_in_fields() -> None:
    from swactor.wire import QuiescenceProof, QuiescenceProofKind

    with pytest.raises(
        FieldTypeError, match=r"QuiescenceProof\.ring_id: expected RingId, got EdgeId"
    ):
        QuiescenceProof(EdgeId(3), QuiescenceProofKind.WorkerReaped)  # type: ignore[arg-type]
    proof = QuiescenceProof(3, QuiescenceProofKind.WorkerReaped)  # type: ignore[arg-type]
    assert type(proof.ring_id) is RingId
    assert RingId(EdgeId(3)) == 3  # an explicit conversion is allowed
