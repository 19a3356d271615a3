"""Standing step grants, and wake hints through doorbells (spec §14, §21, §29).

A real worker with a `WorkerDoorbells` set, as GpuWorkerCtl starts it: one GrantSteps
names the ring and the first sequence before any object exists, each object loaded runs
the grant's next step (its output gets as many rows as its input), one StepCompleted
line reports it, and every wake hint in either direction goes through an eventfd, none
as a JSON line.
"""

from __future__ import annotations

import struct
import time

from swactor.node.worker_ctl import WorkerRoutes
from swactor.ring import Doorbell, Ring
from swactor.testing.worker_rig import WorkerRig, read_all, record, write_all
from swactor.wire import (
    AwaitedInput,
    ConfigureRole,
    DeviceObjectHandle,
    EdgeId,
    GrantSteps,
    ObjectFailed,
    ObjectFailure,
    ObjectHeader,
    ObjectId,
    ObjectLoaded,
    ObjectProduced,
    OutputBinding,
    PortId,
    RevokeSteps,
    RingDirection,
    RingId,
    RoleConfigured,
    RoleId,
    Sequence,
    StepCompleted,
    StepFailed,
    StepFailure,
    StepId,
    WorkerGeneration,
)

ROW = 4 * 4  # four f32 per row


def _grant(first_step: int, sequence: int) -> GrantSteps:
    return GrantSteps(
        RoleId(5), StepId(first_step),
        AwaitedInput(PortId(1), RingId(1), Sequence(sequence), ROW),
        OutputBinding(PortId(1), RingId(2), ObjectId(sequence + 1), Sequence(sequence), ROW,
                      per_input_row=True),
    )


def served(rig: WorkerRig, command: GrantSteps | RevokeSteps) -> None:
    """Send the command and wait until the worker served it (stdin lines are served in
    order, so the answer to a ConfigureRole after it says so): an object that came
    before a grant would be reported as a plain ObjectLoaded line (the grant still runs
    it), and one that came before a revocation would still run."""
    rig.send(command)
    rig.send(ConfigureRole(RoleId(99), {"kind": "scale", "factor": 1.0}))
    assert rig.expect(RoleConfigured).role_id == 99


def _counted(bell: Doorbell | None) -> int:
    assert bell is not None
    return bell.drain()


def _consumed(ring: Ring, timeout_s: float = 30.0) -> None:
    """Wait until the worker took every committed byte of `ring` (bounded)."""
    deadline = time.monotonic() + timeout_s
    while ring.consume != ring.commit:
        assert time.monotonic() < deadline, "the worker never read the ring"
        time.sleep(0.002)


def test_a_standing_grant_runs_each_object_in_order_reported_once() -> None:
    """One GrantSteps, no command per object: each object the ring loads runs the
    grant's next step, woken by doorbells only, and each step is reported by one
    StepCompleted carrying its record (no ObjectLoaded / ObjectProduced line). After
    RevokeSteps an object is not run and not kept: a later grant's step is not failed
    by it."""
    rig = WorkerRig(doorbells=True)
    try:
        rig.initialize()
        ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
        egress = rig.add_ring(2, RingDirection.Egress, 4096)
        rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 2.0}))
        rig.expect(RoleConfigured)
        assert rig.bells is not None
        served(rig, _grant(7, 0))
        last = 0
        for sequence, rows in ((0, 3), (1, 1)):  # a prompt of 3 rows, then one row
            values = [float(i + 10 * sequence) for i in range(4 * rows)]
            payload = struct.pack(f"<{len(values)}f", *values)
            write_all(rig, ingress, record(sequence + 1, sequence, payload))
            data = read_all(rig, egress, ObjectHeader.LEN + rows * ROW)
            header = ObjectHeader.unpack(data)
            assert (header.object_id, header.sequence, header.extent) == (
                sequence + 1, sequence, rows * ROW)
            got = struct.unpack(f"<{len(values)}f", data[ObjectHeader.LEN:])
            assert list(got) == [2.0 * v for v in values]
            done = rig.expect(StepCompleted)  # the step's only line
            assert (done.role_id, done.step_id) == (5, 7 + sequence)
            step = done.record
            assert step is not None
            assert (step.sequence, step.input_object_id, step.input_extent) == (
                sequence, sequence + 1, rows * ROW)
            assert (step.output_object_id, step.output_extent) == (sequence + 1, rows * ROW)
            assert last <= step.loaded_ns <= step.started_ns <= step.produced_ns
            assert step.produced_ns <= step.completed_ns
            last = step.completed_ns
        served(rig, RevokeSteps(RoleId(5)))
        write_all(rig, ingress, record(3, 2, bytes(ROW)))
        _consumed(ingress)  # loaded after the revocation: freed, never run
        served(rig, _grant(20, 3))
        write_all(rig, ingress, record(4, 3, bytes(ROW)))
        read_all(rig, egress, ObjectHeader.LEN + ROW)
        done = rig.expect(StepCompleted)
        assert done.step_id == 20 and done.record is not None and done.record.sequence == 3
        assert rig.wakes == [], "no wake hint travelled as a JSON line"
        assert _counted(rig.bells.readable) > 0, "the egress commits rang the node"
        assert _counted(rig.bells.writable) > 0, "the ingress consumption rang the node"
    finally:
        rig.close()


def test_a_granted_step_fails_when_its_ring_loads_another_sequence() -> None:
    """The sequence gate: the grant names sequence 1 first, sequence 0 comes; the step
    fails InvalidInputHandle and the grant ends (a later object runs nothing)."""
    rig = WorkerRig(doorbells=True)
    try:
        rig.initialize()
        ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
        rig.add_ring(2, RingDirection.Egress, 4096)
        rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 2.0}))
        rig.expect(RoleConfigured)
        served(rig, _grant(1, 1))
        write_all(rig, ingress, record(1, 0, bytes(ROW)))
        failed = rig.expect(StepFailed)  # no ObjectLoaded line before it
        assert (failed.step_id, failed.reason) == (1, StepFailure.InvalidInputHandle)
        rig.send(ConfigureRole(RoleId(6), {"kind": "scale", "factor": 1.0}))
        assert rig.expect(RoleConfigured).role_id == 6, "nothing else was reported"
    finally:
        rig.close()


def test_object_events_go_to_the_stage_controller_only() -> None:
    """The Tx/Rx edge actors are lifecycle gates that objects do not pass (rx_edge.yaml,
    tx_edge.yaml): the worker's object events reach the StageController alone."""
    controller = object()
    edge = object()
    routes = WorkerRoutes(stage_controllers=[controller],  # type: ignore[list-item]
                          edges={RingId(1): edge})  # type: ignore[dict-item]
    handle = DeviceObjectHandle(WorkerGeneration(1), 7)
    events = [
        ObjectLoaded(RingId(1), EdgeId(3), PortId(1), ObjectId(1), Sequence(0), 8, handle),
        ObjectProduced(RingId(1), EdgeId(3), PortId(1), ObjectId(1), Sequence(0), 8),
        ObjectFailed(RingId(1), EdgeId(3), PortId(1), None, None, ObjectFailure.EofMidObject),
    ]
    for event in events:
        assert list(routes.targets(event)) == [controller], type(event).__name__
