"""Steps issued ahead of their input, and wake hints through doorbells (spec §14, §21, §29).

A real worker with a `WorkerDoorbells` set, as GpuWorkerCtl starts it: the ExecuteStep
names its input by ring and sequence before the object exists (`awaits`), the step runs
when the object is loaded, its output gets as many rows as the input, and every wake
hint in either direction goes through an eventfd, none as a JSON line.
"""

from __future__ import annotations

import struct

from swactor.node.worker_ctl import WorkerRoutes
from swactor.ring import Doorbell
from swactor.testing.worker_rig import WorkerRig, read_all, record, write_all
from swactor.wire import (
    AwaitedInput,
    ConfigureRole,
    DeviceObjectHandle,
    EdgeId,
    ExecuteStep,
    ObjectFailed,
    ObjectFailure,
    ObjectHeader,
    ObjectId,
    ObjectLoaded,
    ObjectProduced,
    OutputBinding,
    PortId,
    ReleaseDeviceObject,
    ReleaseFailed,
    ReleaseFailure,
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


def _armed(step: int, sequence: int) -> ExecuteStep:
    return ExecuteStep(
        RoleId(5), StepId(step), (),
        (OutputBinding(PortId(1), RingId(2), ObjectId(sequence + 1), Sequence(sequence), ROW,
                       per_input_row=True),),
        None, True,
        awaits=(AwaitedInput(PortId(1), RingId(1), Sequence(sequence), ROW),),
    )


def _counted(bell: Doorbell | None) -> int:
    assert bell is not None
    return bell.drain()


def test_a_step_issued_ahead_runs_when_its_object_loads_woken_by_doorbells() -> None:
    rig = WorkerRig(doorbells=True)
    try:
        rig.initialize()
        ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
        egress = rig.add_ring(2, RingDirection.Egress, 4096)
        rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 2.0}))
        rig.expect(RoleConfigured)
        assert rig.bells is not None
        freed: list[DeviceObjectHandle] = []
        for sequence, rows in ((0, 3), (1, 1)):  # a prompt of 3 rows, then one row
            rig.send(_armed(sequence + 1, sequence))  # before its object exists
            values = [float(i + 10 * sequence) for i in range(4 * rows)]
            payload = struct.pack(f"<{len(values)}f", *values)
            write_all(rig, ingress, record(sequence + 1, sequence, payload))
            loaded = rig.expect(ObjectLoaded)
            assert (loaded.sequence, loaded.extent) == (sequence, rows * ROW)
            data = read_all(rig, egress, ObjectHeader.LEN + rows * ROW)
            header = ObjectHeader.unpack(data)
            assert (header.object_id, header.sequence, header.extent) == (
                sequence + 1, sequence, rows * ROW)
            got = struct.unpack(f"<{len(values)}f", data[ObjectHeader.LEN:])
            assert list(got) == [2.0 * v for v in values]
            assert rig.expect(ObjectProduced).extent == rows * ROW
            assert rig.expect(StepCompleted).step_id == sequence + 1
            freed.append(loaded.device_handle)  # with the step: no DeviceObjectReleased
        rig.send(ReleaseDeviceObject(freed[0]))  # so a release asked later finds nothing
        failed = rig.expect(ReleaseFailed)
        assert (failed.device_handle, failed.reason) == (freed[0], ReleaseFailure.UnknownHandle)
        assert rig.wakes == [], "no wake hint travelled as a JSON line"
        assert _counted(rig.bells.readable) > 0, "the egress commits rang the node"
        assert _counted(rig.bells.writable) > 0, "the ingress consumption rang the node"
    finally:
        rig.close()


def test_an_armed_step_fails_when_its_ring_loads_another_sequence() -> None:
    rig = WorkerRig(doorbells=True)
    try:
        rig.initialize()
        ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
        rig.add_ring(2, RingDirection.Egress, 4096)
        rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 2.0}))
        rig.expect(RoleConfigured)
        rig.send(_armed(1, 1))  # armed for sequence 1; sequence 0 comes
        write_all(rig, ingress, record(1, 0, bytes(ROW)))
        rig.expect(ObjectLoaded)
        failed = rig.expect(StepFailed)
        assert (failed.step_id, failed.reason) == (1, StepFailure.InvalidInputHandle)
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
