"""RingRecord, the part ingress and egress ring records share: `open_ring` opens the
handle only on a ring whose header matches the planned layout, the layout_valid guard
only reads whether it did, and fault_reason reads a Faulted shared state."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from swactor.arena import Arena
from swactor.ring import Ring
from swactor.testing.ring_rig import make_layout
from swactor.testing.worker_rig import float_spec
from swactor.wire import (
    EdgeId,
    InstallRing,
    PortId,
    RingDirection,
    RingFaultReason,
    RingId,
    WorkerEvent,
    WorkerGeneration,
)
from swactor.worker.bridge import DeviceBridge
from swactor.worker.ring_record import RingRecord

LAYOUT = make_layout(1 << 16, ring_id=5)


@pytest.fixture
def arena() -> Iterator[Arena]:
    mapped = Arena.create(1 << 20)
    yield mapped
    mapped.close()  # ArenaBusyError if a handle or view was left open


def record(arena: Arena) -> RingRecord:
    command = InstallRing(RingId(5), EdgeId(2), PortId(0), RingDirection.Ingress, LAYOUT,
                          float_spec())
    sent: list[WorkerEvent] = []
    return RingRecord(command, arena, DeviceBridge("CPU", WorkerGeneration(1)), sent.append)


def test_open_ring_opens_the_ring_the_node_initialised(arena: Arena) -> None:
    owner = Ring.init(arena, LAYOUT)
    rec = record(arena)
    rec.open_ring()
    assert rec.layout_valid(object()) is True
    assert rec.ring is not None and rec.ring.ring_id == 5
    assert rec.fault_reason(rec.ring) is None
    owner.fault(RingFaultReason.WorkerShuttingDown)
    assert rec.fault_reason(rec.ring) is RingFaultReason.WorkerShuttingDown
    rec.ring.close()
    owner.close()


def test_open_ring_refuses_a_ring_without_a_header_and_logs_why(
    arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    rec = record(arena)
    with caplog.at_level(logging.WARNING, logger="swactor.worker.ring_record"):
        rec.open_ring()
    assert rec.layout_valid(object()) is False
    assert rec.ring is None
    assert "ring 5: open refused" in caplog.text


def test_layout_valid_is_a_pure_read(arena: Arena) -> None:
    """A guard reads the ledger and changes nothing: asking opens no handle."""
    owner = Ring.init(arena, LAYOUT)
    rec = record(arena)
    assert rec.layout_valid(object()) is False  # the install step has not run
    assert rec.layout_valid(object()) is False
    assert rec.ring is None
    rec.open_ring()
    ring = rec.ring
    assert rec.layout_valid(object()) is True
    assert rec.layout_valid(object()) is True
    assert rec.ring is ring  # asked twice, still the one handle
    assert ring is not None
    ring.close()
    owner.close()
