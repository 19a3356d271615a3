"""RingSpec and RingLayout rules, each rejected with its field and rule."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.wire import (
    HostPinning,
    InvalidFieldError,
    QuiescenceProof,
    QuiescenceProofKind,
    RingDirection,
    RingId,
    RingLayout,
    RingLayoutError,
    RingSpec,
    WakeCoalescing,
)

GOOD = RingLayout(
    ring_id=RingId(1),
    arena_offset=4096,
    total_len=8192,
    header_offset=4096,
    data_offset=4096 + 256,
    data_capacity=4096,
    alignment=256,
)


def test_at_lays_the_data_out_a_page_past_the_header() -> None:
    layout = RingLayout.at(3, 8192, 1 << 16)
    assert layout == RingLayout(RingId(3), 8192, 4096 + (1 << 16), 8192, 12288, 1 << 16, 64)
    assert RingLayout.at(1, 0, 4096, header_bytes=4097).data_offset == 8192  # two pages
    granted = RingLayout.at(2, 4096, 8192 * 8, alignment=8192, total_len=4096 * 17)
    assert (granted.data_offset, granted.end_offset, granted.alignment) == (8192, 4096 * 18, 8192)
    with pytest.raises(RingLayoutError, match="data_capacity"):
        RingLayout.at(1, 0, 4096, total_len=4096)  # the data would end past the lease


def test_good_layout_and_helpers() -> None:
    assert GOOD.end_offset == 12288
    other = dataclasses.replace(GOOD, arena_offset=12288, header_offset=12288, data_offset=12544)
    assert not GOOD.overlaps(other) and not other.overlaps(GOOD)
    shifted = dataclasses.replace(GOOD, arena_offset=12224, header_offset=12224, data_offset=12288)
    assert GOOD.overlaps(shifted)
    spec = RingSpec(4096, 64, RingDirection.Ingress, HostPinning.Pageable, WakeCoalescing.ReadySet)
    assert GOOD.satisfies(spec)
    assert not GOOD.satisfies(dataclasses.replace(spec, data_capacity=8192))
    assert not GOOD.satisfies(dataclasses.replace(spec, alignment=512, data_capacity=4096))


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"alignment": 96}, "alignment", "not a power of two"),
        ({"alignment": 32}, "alignment", "not a power of two in 64.."),
        ({"alignment": 1 << 22}, "alignment", "not a power of two"),
        ({"arena_offset": 4100, "header_offset": 4160}, "arena_offset", "multiple of 64"),
        ({"header_offset": 4100}, "header_offset", "multiple of 64"),
        ({"header_offset": 4032}, "header_offset", "before arena_offset"),
        ({"header_offset": 4352 - 32}, "header_offset", "multiple of 64"),
        ({"header_offset": 4352}, "data_offset", "overlaps the 64-byte ring header"),
        ({"data_offset": 4096 + 320}, "data_offset", "multiple of alignment"),
        ({"data_capacity": 0}, "data_capacity", "positive multiple"),
        ({"data_capacity": 4000}, "data_capacity", "positive multiple"),
        ({"total_len": 4351}, "data_capacity", "ends past arena_offset + total_len"),
        ({"data_capacity": 8192}, "data_capacity", "ends past"),
    ],
)
def test_layout_rules(changes: dict[str, int], field: str, rule: str) -> None:
    with pytest.raises(RingLayoutError) as info:
        dataclasses.replace(GOOD, **changes)  # type: ignore[arg-type]
    assert info.value.field == field, info.value
    assert rule in info.value.rule


def test_layout_u64_overflow() -> None:
    with pytest.raises(RingLayoutError, match="overflows u64"):
        RingLayout(RingId(1), 2**64 - 4096, 8192, 2**64 - 4096, 2**64 - 3840, 256, 256)
    with pytest.raises(InvalidFieldError, match=r"RingLayout\.total_len"):
        dataclasses.replace(GOOD, total_len=2**64)


@pytest.mark.parametrize(
    ("capacity", "alignment", "field"),
    [
        (4096, 100, "alignment"),
        (4096, 32, "alignment"),
        (0, 64, "data_capacity"),
        (100, 64, "data_capacity"),
        (2**64, 64, "data_capacity"),
    ],
)
def test_ring_spec_rules(capacity: int, alignment: int, field: str) -> None:
    with pytest.raises(InvalidFieldError) as info:
        RingSpec(
            capacity,
            alignment,
            RingDirection.Egress,
            HostPinning.Pageable,
            WakeCoalescing.PendingBit,
        )
    assert info.value.field == field


def test_quiescence_proof_json() -> None:
    proof = QuiescenceProof(RingId(4), QuiescenceProofKind.WorkerReaped)
    assert proof.to_json() == {"ring_id": 4, "kind": "WorkerReaped"}
    assert QuiescenceProof.from_json(proof.to_json()) == proof
