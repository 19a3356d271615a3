"""ObjectSpec rules, the 40-byte ObjectHeader, the 16-byte EdgePreamble, SequenceGate."""

from __future__ import annotations

import contextlib
import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.testing.examples import example, strategy
from swactor.wire import (
    DTypeFamily,
    EdgeId,
    EdgePreamble,
    InvalidFieldError,
    LayoutRule,
    ObjectFailure,
    ObjectHeader,
    ObjectHeaderError,
    ObjectId,
    ObjectKind,
    ObjectSpec,
    PreambleError,
    Sequence,
    SequenceGate,
    SequencePolicy,
    ShapeRule,
    StreamFaultReason,
    WireError,
)

# Hand-assembled: magic b"SWOB", version 1, header_len 40, object_id 0x0102030405060708,
# sequence 9, extent 0x40, flags 0xA0B0C0D0, reserved 0 -- all little endian.
HEADER_BYTES = bytes.fromhex(
    "53574f42 0100 2800 0807060504030201 0900000000000000 4000000000000000 d0c0b0a0 00000000"
)
HEADER = ObjectHeader(ObjectId(0x0102030405060708), Sequence(9), extent=0x40, flags=0xA0B0C0D0)


def test_header_packs_to_hand_assembled_bytes() -> None:
    assert HEADER.pack() == HEADER_BYTES
    assert len(HEADER_BYTES) == 40 == ObjectHeader.LEN
    parsed = ObjectHeader.unpack(HEADER_BYTES)
    assert parsed == HEADER
    assert type(parsed.object_id) is ObjectId and type(parsed.sequence) is Sequence
    assert parsed.to_json()["object_id"] == 0x0102030405060708
    buffer = bytearray(48)
    HEADER.pack_into(buffer, 8)
    assert bytes(buffer[8:]) == HEADER_BYTES
    assert ObjectHeader.unpack(memoryview(buffer), 8) == HEADER


def _patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(HEADER_BYTES)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "reason", "field"),
    [
        (HEADER_BYTES[:39], ObjectFailure.HeaderMalformed, "header_len"),
        (b"", ObjectFailure.HeaderMalformed, "header_len"),
        (_patched(0, "<I", 0x12345678), ObjectFailure.UnsupportedObjectVersion, "magic"),
        (_patched(4, "<H", 2), ObjectFailure.UnsupportedObjectVersion, "version"),
        (_patched(4, "<H", 0), ObjectFailure.UnsupportedObjectVersion, "version"),
        (_patched(6, "<H", 32), ObjectFailure.HeaderMalformed, "header_len"),
        (_patched(6, "<H", 48), ObjectFailure.HeaderMalformed, "header_len"),
        (_patched(36, "<I", 1), ObjectFailure.HeaderMalformed, "reserved"),
    ],
)
def test_malformed_headers_give_their_section_37_reason(
    data: bytes, reason: ObjectFailure, field: str
) -> None:
    with pytest.raises(ObjectHeaderError) as info:
        ObjectHeader.unpack(data)
    assert info.value.reason is reason
    assert info.value.field == field
    assert reason.value in str(info.value)


def test_unpack_at_offset_past_end_is_malformed() -> None:
    with pytest.raises(ObjectHeaderError, match="0 bytes available") as info:
        ObjectHeader.unpack(HEADER_BYTES, 40)
    assert info.value.reason is ObjectFailure.HeaderMalformed


def test_header_constructor_rejects_out_of_range_fields() -> None:
    with pytest.raises(InvalidFieldError, match=r"ObjectHeader\.extent"):
        ObjectHeader(ObjectId(1), Sequence(0), extent=2**64)
    with pytest.raises(InvalidFieldError, match=r"ObjectHeader\.flags"):
        ObjectHeader(ObjectId(1), Sequence(0), extent=0, flags=2**32)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_header_unpack_fuzz_only_typed_errors(data: bytes) -> None:
    try:
        header = ObjectHeader.unpack(data)
    except ObjectHeaderError as exc:
        assert exc.reason in (ObjectFailure.HeaderMalformed, ObjectFailure.UnsupportedObjectVersion)
        return
    assert header.pack() == data[:40]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=40, max_size=40), st.integers(0, 39))
def test_header_fuzz_near_valid(noise: bytes, keep: int) -> None:
    data = HEADER_BYTES[:keep] + noise[keep:]
    with contextlib.suppress(ObjectHeaderError):
        assert ObjectHeader.unpack(data).pack() == data


@settings(max_examples=100, deadline=None)
@given(strategy(ObjectHeader))
def test_header_binary_round_trip(header: ObjectHeader) -> None:
    packed = header.pack()
    assert len(packed) == 40
    assert ObjectHeader.unpack(packed) == header


def _spec(**changes: object) -> ObjectSpec:
    return dataclasses.replace(example(ObjectSpec), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"dtype_width_bytes": 3}, "dtype_width_bytes", "is not a Float width"),
        (
            {"dtype_family": DTypeFamily.BFloat, "dtype_width_bytes": 4},
            "dtype_width_bytes",
            "BFloat",
        ),
        ({"alignment": 0}, "alignment", "outside 1.."),
        ({"alignment": 3, "max_extent": 9}, "alignment", "multiple of dtype_width_bytes"),
        ({"max_extent": 0}, "max_extent", "at least 1"),
        ({"max_extent": 130}, "max_extent", "multiple of alignment"),
        ({"max_extent": 2**64}, "max_extent", "outside"),
        ({"shape": ShapeRule.Vector}, "alignment", "granule is one element"),
    ],
)
def test_object_spec_rules(changes: dict[str, object], field: str, rule: str) -> None:
    with pytest.raises(InvalidFieldError) as info:
        _spec(**changes)
    assert info.value.field == field
    assert rule in info.value.rule


def test_check_against_extent_rules() -> None:
    spec = ObjectSpec(
        ObjectKind.Activation,
        max_extent=1024,
        dtype_family=DTypeFamily.Float,
        dtype_width_bytes=2,
        shape=ShapeRule.Rows,
        layout=LayoutRule.RowMajor,
        alignment=128,
        sequence_policy=SequencePolicy.Contiguous,
    )
    for extent in (0, 128, 1024):
        ObjectHeader(ObjectId(1), Sequence(0), extent).check_against(spec)
    with pytest.raises(ObjectHeaderError, match="1152 exceeds max_extent 1024") as info:
        ObjectHeader(ObjectId(1), Sequence(0), 1152).check_against(spec)
    assert info.value.reason is ObjectFailure.ExtentExceedsMax
    with pytest.raises(ObjectHeaderError, match="not a multiple of 128") as info:
        ObjectHeader(ObjectId(1), Sequence(0), 130).check_against(spec)
    assert info.value.reason is ObjectFailure.ExtentAlignmentInvalid


def test_sequence_gate_contiguous() -> None:
    gate = SequenceGate(SequencePolicy.Contiguous)
    with pytest.raises(ObjectHeaderError, match="may not follow nothing") as info:
        gate.admit(ObjectHeader(ObjectId(1), Sequence(1), 0))
    assert info.value.reason is ObjectFailure.SequenceViolation
    for seq in (0, 1, 2):
        gate.admit(ObjectHeader(ObjectId(seq), Sequence(seq), 0))
    for bad in (2, 4, 0):
        with pytest.raises(ObjectHeaderError, match="may not follow 2"):
            gate.admit(ObjectHeader(ObjectId(9), Sequence(bad), 0))


def test_sequence_gate_increasing() -> None:
    gate = SequenceGate(SequencePolicy.Increasing)
    gate.admit(ObjectHeader(ObjectId(1), Sequence(5), 0))
    gate.admit(ObjectHeader(ObjectId(2), Sequence(9), 0))
    with pytest.raises(ObjectHeaderError) as info:
        gate.admit(ObjectHeader(ObjectId(3), Sequence(9), 0))
    assert info.value.reason is ObjectFailure.SequenceViolation
    assert gate.last == 9


# --- preamble ---------------------------------------------------------------------------

PREAMBLE_BYTES = bytes.fromhex("53574544 0100 0000 efcdab8967452301")


def test_preamble_layout() -> None:
    preamble = EdgePreamble(EdgeId(0x0123456789ABCDEF))
    assert preamble.pack() == PREAMBLE_BYTES
    assert EdgePreamble.unpack(PREAMBLE_BYTES + b"trailing") == preamble


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (PREAMBLE_BYTES[:15], StreamFaultReason.PreambleTruncated),
        (b"", StreamFaultReason.PreambleTruncated),
        (b"XWED" + PREAMBLE_BYTES[4:], StreamFaultReason.PreambleGarbage),
        (PREAMBLE_BYTES[:6] + b"\x01\x00" + PREAMBLE_BYTES[8:], StreamFaultReason.PreambleGarbage),
        (
            PREAMBLE_BYTES[:4] + b"\x02\x00" + PREAMBLE_BYTES[6:],
            StreamFaultReason.PreambleVersionUnsupported,
        ),
    ],
)
def test_preamble_errors(data: bytes, reason: StreamFaultReason) -> None:
    with pytest.raises(PreambleError) as info:
        EdgePreamble.unpack(data)
    assert info.value.reason is reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=32))
def test_preamble_fuzz_only_typed_errors(data: bytes) -> None:
    try:
        preamble = EdgePreamble.unpack(data)
    except PreambleError as exc:
        assert isinstance(exc, WireError)
        return
    assert preamble.pack() == data[:16]


@settings(max_examples=100, deadline=None)
@given(strategy(EdgePreamble))
def test_preamble_round_trip(preamble: EdgePreamble) -> None:
    assert EdgePreamble.unpack(preamble.pack()) == preamble
