"""The token-out reader checks every record as a stage's ingress parser does (spec §17, §32)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from swactor.fsm.generated import ingress_ring as ir
from swactor.wire import RingFaultReason, RunFaultReason
from tests.orchestrator.token_ring import TokenRing


@pytest.fixture
def ring() -> Iterator[TokenRing]:
    rig = TokenRing()
    yield rig
    rig.close()


def ids(*tokens: int) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def test_records_are_loaded_in_order(ring: TokenRing) -> None:
    ring.write(ring.record(0, ids(42)) + ring.record(1, ids(7)))
    assert ring.loaded == [(1, 0, (42,)), (2, 1, (7,))]
    assert ring.failed == [] and ring.reader.consuming
    assert ring.writable >= 1, "consuming bytes tells the recv pump the ring has room"


def test_a_record_split_across_wakes_is_whole_once_complete(ring: TokenRing) -> None:
    data = ring.record(0, ids(99))
    ring.write(data[:10])
    ring.write(data[10:41])
    assert ring.loaded == []
    ring.write(data[41:])
    assert ring.loaded == [(1, 0, (99,))]


@pytest.mark.parametrize("cut", [1, 20, 40, 42])
def test_producer_close_mid_record_is_eof_mid_object(ring: TokenRing, cut: int) -> None:
    ring.write(ring.record(0, ids(5))[:cut])
    ring.producer.close_producer()
    ring.reader.readable()
    assert ring.failed == [RunFaultReason.EofMidObject]
    assert ring.reader.machine.state is ir.State.Faulted and not ring.reader.consuming


def test_producer_close_at_a_boundary_is_a_clean_end(ring: TokenRing) -> None:
    ring.write(ring.record(0, ids(5)))
    ring.producer.close_producer()
    ring.reader.readable()
    assert ring.failed == [] and ring.loaded == [(1, 0, (5,))]
    assert not ring.reader.consuming, "nothing more can come: the endpoint stops polling"


def test_faulted_ring_is_a_ring_fault(ring: TokenRing) -> None:
    ring.producer.fault(RingFaultReason.WorkerInternal)
    ring.reader.readable()
    assert ring.failed == [RunFaultReason.RingFault]


def test_bad_header_is_malformed(ring: TokenRing) -> None:
    ring.write(b"\xa5" * 44)
    assert ring.failed == [RunFaultReason.ObjectHeaderMalformed]


def test_sequence_out_of_policy_is_a_sequence_violation(ring: TokenRing) -> None:
    ring.write(ring.record(0, ids(1)) + ring.record(5, ids(2)))
    assert ring.loaded == [(1, 0, (1,))]
    assert ring.failed == [RunFaultReason.SequenceViolation]


def test_misaligned_extent_is_refused(ring: TokenRing) -> None:
    ring.write(ring.record(0, b"\x01\x02\x03"))
    assert ring.failed == [RunFaultReason.ObjectHeaderMalformed]
    assert ring.loaded == []
