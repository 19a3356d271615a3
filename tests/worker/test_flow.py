"""End to end through one real worker: ingress record -> device -> role -> egress record."""

from __future__ import annotations

import struct

from swactor.testing.worker_rig import WorkerRig, grant, read_all, record, write_all
from swactor.wire import (
    ConfigureRole,
    ObjectHeader,
    RingDirection,
    RoleConfigured,
    RoleId,
    StepCompleted,
)


def test_ready_reports_cpu_backend(rig: WorkerRig) -> None:
    assert rig.proc.poll() is None
    # initialize() already checked WorkerReady; a second init is a protocol violation
    # tested elsewhere. The backend choice is visible in the ready event:
    again = WorkerRig()
    again.backend = {"threads": 1}  # `swactor node --threads 1`
    try:
        ready = again.initialize(generation=7)
        assert ready.worker_generation == 7
        assert ready.backend == {"device": "CPU", "threads": 1}
        assert ready.pid == again.proc.pid
    finally:
        again.close()


def test_scale_role_round_trip(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    egress = rig.add_ring(2, RingDirection.Egress, 4096)
    values = [float(i) - 3.5 for i in range(64)]
    payload = struct.pack(f"<{len(values)}f", *values)
    rig.send(ConfigureRole(RoleId(5), {"kind": "scale", "factor": 3.0}))
    rig.expect(RoleConfigured)
    rig.send(grant(5, 1, object_id=12, flags=9))
    write_all(rig, ingress, record(11, 0, payload))
    data = read_all(rig, egress, ObjectHeader.LEN + len(payload))
    header = ObjectHeader.unpack(data)
    assert (header.object_id, header.sequence, header.extent, header.flags) == (
        12, 0, len(payload), 9,
    )  # fmt: skip
    got = struct.unpack(f"<{len(values)}f", data[ObjectHeader.LEN :])
    assert list(got) == [v * 3.0 for v in values]
    done = rig.expect(StepCompleted)  # the step's only line: no ObjectLoaded/Produced
    assert done.step_id == 1 and done.record is not None
    assert (done.record.sequence, done.record.input_object_id, done.record.input_extent,
            done.record.output_object_id, done.record.output_extent) == (
        0, 11, len(payload), 12, len(payload))
