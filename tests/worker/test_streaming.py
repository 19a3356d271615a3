"""Objects larger than their rings stream through; a step waits for egress space.

Each step runs under a standing grant (`GrantSteps`), sent before its object: the
object is loaded and its step runs with no line in between, and the step's one
StepCompleted carries what it did."""

from __future__ import annotations

import os
import queue
import time

from swactor.ring import Ring
from swactor.testing.worker_rig import WorkerRig, grant, read_all, record, write_all
from swactor.wire import (
    ConfigureRole,
    ObjectHeader,
    RingDirection,
    RingId,
    RingWritable,
    RoleConfigured,
    RoleId,
    StepCompleted,
)

RING = 4096


def echo(rig: WorkerRig) -> None:
    rig.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
    rig.expect(RoleConfigured)
    rig.send(grant(1, 0, object_id=11))  # step k echoes sequence k as object 11 + k


def test_object_ten_times_the_ring_loads_and_streams_out(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, RING)
    egress = rig.add_ring(2, RingDirection.Egress, RING)
    payload = os.urandom(10 * RING + 4 * 37)
    echo(rig)
    write_all(rig, ingress, record(10, 0, payload))
    data = read_all(rig, egress, ObjectHeader.LEN + len(payload))
    assert ObjectHeader.unpack(data).extent == len(payload)
    assert data[ObjectHeader.LEN :] == payload
    done = rig.expect(StepCompleted)
    assert done.step_id == 0 and done.record is not None
    assert (done.record.input_extent, done.record.output_extent) == (len(payload),) * 2
    assert ingress.consume == ingress.commit == ObjectHeader.LEN + len(payload)


def test_step_waits_for_egress_space_and_completes_once_drained(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, 8 * RING)
    egress = rig.add_ring(2, RingDirection.Egress, RING)
    payload = os.urandom(3 * RING)
    echo(rig)
    # The output (3 rings' worth) is larger than the free egress space (one ring): the
    # worker fills the ring, then the step waits; nobody reads yet.
    write_all(rig, ingress, record(10, 0, payload))
    deadline = time.monotonic() + 30
    while egress.commit < RING:
        assert time.monotonic() < deadline, "worker never filled the free space"
        time.sleep(0.01)
    try:
        early = rig.events.get(timeout=0.3)
    except queue.Empty:
        early = None
    assert not isinstance(early, StepCompleted)
    assert egress.commit == RING  # full: nothing more was written

    data = read_all(rig, egress, ObjectHeader.LEN + len(payload))
    assert data[ObjectHeader.LEN :] == payload
    done = rig.expect(StepCompleted)
    assert done.step_id == 0 and done.record is not None
    assert done.record.output_object_id == 11


def test_empty_object_loads_and_echoes(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, RING)
    egress = rig.add_ring(2, RingDirection.Egress, RING)
    echo(rig)
    write_all(rig, ingress, record(10, 0, b""))
    data = read_all(rig, egress, ObjectHeader.LEN)
    assert ObjectHeader.unpack(data).extent == 0
    done = rig.expect(StepCompleted)
    assert done.step_id == 0 and done.record is not None
    assert (done.record.input_extent, done.record.output_extent) == (0, 0)


def _drain(rig: WorkerRig, egress: Ring, length: int) -> bytes:
    """Read `length` bytes as the node's send pump does: RingWritable only when the
    consume found the writable-pending bit clear."""
    out = bytearray(length)
    got = 0
    deadline = time.monotonic() + 30
    while got < length:
        assert time.monotonic() < deadline, f"stuck at {got} of {length} bytes"
        n, hint = egress.read_into(memoryview(out)[got:])
        got += n
        if hint:
            rig.send(RingWritable(RingId(egress.ring_id)))
        if n == 0:
            time.sleep(0.002)
    return bytes(out)


def test_a_consumer_that_hints_only_when_the_pending_bit_says_so_drains_a_big_object(
    rig: WorkerRig,
) -> None:
    """The node's send pump sends RingWritable only when its consume found the
    writable-pending bit clear (spec §21). A hint that comes while the producer is not
    waiting leaves the bit set; a producer that then waits for space must clear it before
    it waits, or the consumer never hints again and the step never completes."""
    ingress = rig.add_ring(1, RingDirection.Ingress, 16 * RING)
    egress = rig.add_ring(2, RingDirection.Egress, RING)
    echo(rig)
    small, big = os.urandom(64), os.urandom(6 * RING)
    for step, payload in enumerate((small, big)):
        write_all(rig, ingress, record(10 + step, step, payload))
        data = _drain(rig, egress, ObjectHeader.LEN + len(payload))
        assert data[ObjectHeader.LEN:] == payload
        done = rig.expect(StepCompleted)
        assert done.step_id == step and done.record is not None
        assert done.record.output_object_id == 11 + step
