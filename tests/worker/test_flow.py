"""End to end through one real worker: ingress record -> device -> role -> egress record."""

from __future__ import annotations

import struct

from swactor.testing.worker_rig import WorkerRig, read_all, record, write_all
from swactor.wire import (
    ConfigureRole,
    ExecuteStep,
    InputBinding,
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
    StepId,
)


def test_ready_reports_cpu_backend(rig: WorkerRig) -> None:
    assert rig.proc.poll() is None
    # initialize() already checked WorkerReady; a second init is a protocol violation
    # tested elsewhere. The backend choice is visible in the ready event:
    again = WorkerRig()
    try:
        ready = again.initialize(generation=7)
        assert ready.worker_generation == 7
        assert ready.backend == {"device": "CPU"}
        assert ready.pid == again.proc.pid
    finally:
        again.close()


def test_scale_role_round_trip(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    egress = rig.add_ring(2, RingDirection.Egress, 4096)
    values = [float(i) - 3.5 for i in range(64)]
    payload = struct.pack(f"<{len(values)}f", *values)
    write_all(rig, ingress, record(11, 0, payload))
    loaded = rig.expect(ObjectLoaded)
    assert (loaded.ring_id, loaded.edge_id, loaded.port_id) == (1, 101, 1)
    assert (loaded.object_id, loaded.sequence, loaded.extent) == (11, 0, len(payload))

    rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 3.0}))
    rig.expect(RoleConfigured)
    rig.send(
        ExecuteStep(
            RoleId(5), StepId(1),
            (InputBinding(PortId(1), ObjectId(11), Sequence(0), loaded.device_handle),),
            (OutputBinding(PortId(1), RingId(2), ObjectId(12), Sequence(0), len(payload), 9),),
            None, True,
        )
    )  # fmt: skip
    data = read_all(rig, egress, ObjectHeader.LEN + len(payload))
    header = ObjectHeader.unpack(data)
    assert (header.object_id, header.sequence, header.extent, header.flags) == (
        12, 0, len(payload), 9,
    )  # fmt: skip
    got = struct.unpack(f"<{len(values)}f", data[ObjectHeader.LEN :])
    assert list(got) == [v * 3.0 for v in values]
    produced = rig.expect(ObjectProduced)
    assert (produced.ring_id, produced.object_id, produced.extent) == (2, 12, len(payload))
    assert rig.expect(StepCompleted).step_id == 1  # the input went with the step:
    rig.send(ReleaseDeviceObject(loaded.device_handle))  # a later release finds nothing
    assert rig.expect(ReleaseFailed).reason is ReleaseFailure.UnknownHandle
