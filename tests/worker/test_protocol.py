"""The worker's command/event protocol: init checks, fatal paths, steps, release, drain."""

from __future__ import annotations

import os

import pytest

from swactor.testing.worker_rig import WorkerRig, grant, read_all, record, write_all
from swactor.wire import (
    ConfigureRole,
    DeviceObjectHandle,
    DeviceObjectReleased,
    InitializeWorker,
    ObjectHeader,
    ObjectLoaded,
    ReleaseDeviceObject,
    ReleaseFailed,
    ReleaseFailure,
    RingDirection,
    RingFault,
    RingFaultReason,
    RingId,
    RingQuiesced,
    RingReadable,
    RoleConfigured,
    RoleFailed,
    RoleFailure,
    RoleId,
    ShutdownMode,
    ShutdownWorker,
    StepCompleted,
    StepFailed,
    StepFailure,
    UninstallReason,
    UninstallRing,
    WorkerFatal,
    WorkerFatalReason,
    WorkerGeneration,
    WorkerStopped,
    WorkerStoppedReason,
)
from swactor.worker.process import ring_helper_abi


def fatal_exit(rig: WorkerRig, reason: WorkerFatalReason) -> None:
    assert rig.expect(WorkerFatal).reason is reason
    assert rig.wait_exit() == 1


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b'{"type": "Frobnicate", "body": {}}\n', b'{"type": "ShutdownWorker"}\n',
     b'{"type": "InstallRing", "body": {"ring_id": -1}}\n', b"\xff\xfe\n", b"[1, 2]\n",
     b'{"type": "ExecuteStep", "body": {"role_id": 1, "step_id": 1, "inputs": [], '
     b'"outputs": [], "runtime": null, "release_inputs_after": false}}\n'],
    ids=["garbage", "unknown-type", "no-body", "bad-body", "not-utf8", "not-object",
         "execute-step"],
)  # fmt: skip
def test_malformed_line_is_fatal(rig: WorkerRig, line: bytes) -> None:
    rig.send_raw(line)
    fatal_exit(rig, WorkerFatalReason.MalformedControlMessage)


def test_command_before_initialize_is_fatal() -> None:
    rig = WorkerRig()
    try:
        rig.send(ShutdownWorker(ShutdownMode.Graceful))
        fatal_exit(rig, WorkerFatalReason.MalformedControlMessage)
    finally:
        rig.close()


def test_abi_mismatch_and_wrong_ceiling_are_fatal() -> None:
    for ceiling, abi, reason in (
        (None, ring_helper_abi() + 1, WorkerFatalReason.RingHelperAbiMismatch),
        (4096, ring_helper_abi(), WorkerFatalReason.ArenaMapFailed),
    ):
        rig = WorkerRig()
        try:
            size = rig.arena.size if ceiling is None else ceiling
            rig.send(InitializeWorker(WorkerGeneration(1), size, abi, None))
            fatal_exit(rig, reason)
        finally:
            rig.close()


def test_unknown_backend_is_fatal() -> None:
    rig = WorkerRig(backend={"device": "NOSUCHDEVICE"})
    try:
        rig.send(InitializeWorker(WorkerGeneration(1), rig.arena.size, ring_helper_abi(),
                                  rig.backend))  # fmt: skip
        fatal_exit(rig, WorkerFatalReason.BackendInitFailed)
    finally:
        rig.close()


def test_closed_stdin_exits_cleanly(rig: WorkerRig) -> None:
    assert rig.proc.stdin is not None
    rig.proc.stdin.close()
    assert rig.wait_exit() == 0


def loaded_object(rig: WorkerRig, extent: int = 64) -> ObjectLoaded:
    """An object loaded on a ring no grant names: reported, its handle the node's."""
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    write_all(rig, ingress, record(10, 0, os.urandom(extent)))
    return rig.expect(ObjectLoaded)


def test_step_failures_name_their_reason(rig: WorkerRig) -> None:
    """Each refused step of a grant is answered StepFailed with its §37 reason, ends its
    grant and writes nothing; the next grant on the ring runs."""
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    egress = rig.add_ring(2, RingDirection.Egress, 4096)
    rig.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
    rig.expect(RoleConfigured)
    rig.send(ConfigureRole(RoleId(2), {"kind": "no-such-role"}))
    assert rig.expect(RoleFailed).reason is RoleFailure.ConfigInvalid
    rig.send(ConfigureRole(RoleId(3), {"kind": "scale", "factor": "x"}))
    assert rig.expect(RoleFailed).reason is RoleFailure.ConfigInvalid

    cases = [  # (grant arguments, reason), a 64-byte object each
        ({"role": 2}, StepFailure.RoleUnavailable),
        ({"out_ring": 1}, StepFailure.InvalidOutputRing),  # an ingress ring
        ({"out_ring": 77}, StepFailure.InvalidOutputRing),  # not installed
        ({"extent": 60}, StepFailure.OutputExtentInvalid),  # role makes 64 bytes
        ({"extent": 66}, StepFailure.OutputExtentInvalid),  # breaks the alignment
        ({"row_bytes": 48}, StepFailure.OutputExtentInvalid),  # 64 bytes: no whole rows
        ({"ahead": 1}, StepFailure.InvalidInputHandle),  # the grant names the next one
    ]
    for sequence, (args, reason) in enumerate(cases):
        ahead = args.pop("ahead", 0)
        role = args.pop("role", 1)
        rig.send(grant(role, 100 + sequence, sequence=sequence + ahead, **args))
        write_all(rig, ingress, record(10 + sequence, sequence, os.urandom(64)))
        failed = rig.expect(StepFailed)
        assert (failed.step_id, failed.reason) == (100 + sequence, reason)
    assert egress.commit == 0  # nothing was written for a refused step
    # A failed step ended its grant only: the next grant on the ring runs.
    sequence = len(cases)
    rig.send(grant(1, 1, sequence=sequence, object_id=11))
    write_all(rig, ingress, record(10 + sequence, sequence, os.urandom(64)))
    data = read_all(rig, egress, ObjectHeader.LEN + 64)
    assert ObjectHeader.unpack(data).object_id == 11
    assert rig.expect(StepCompleted).step_id == 1


def test_release_and_its_failures(rig: WorkerRig) -> None:
    handle = loaded_object(rig).device_handle
    rig.send(ReleaseDeviceObject(DeviceObjectHandle(WorkerGeneration(9), handle.id)))
    assert rig.expect(ReleaseFailed).reason is ReleaseFailure.StaleGeneration
    rig.send(ReleaseDeviceObject(handle))
    assert rig.expect(DeviceObjectReleased).device_handle == handle
    rig.send(ReleaseDeviceObject(handle))
    assert rig.expect(ReleaseFailed).reason is ReleaseFailure.UnknownHandle


def test_a_grant_takes_an_object_loaded_before_it(rig: WorkerRig) -> None:
    """An object that came before its ring's grant was reported (ObjectLoaded); the
    grant that arrives then runs it."""
    loaded = loaded_object(rig)
    egress = rig.add_ring(2, RingDirection.Egress, 4096)
    rig.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
    rig.expect(RoleConfigured)
    rig.send(grant(1, 1, object_id=11))
    read_all(rig, egress, ObjectHeader.LEN + loaded.extent)
    done = rig.expect(StepCompleted)
    assert done.record is not None and done.record.input_object_id == loaded.object_id


def test_uninstall_quiesces_the_ring(rig: WorkerRig) -> None:
    rig.add_ring(1, RingDirection.Ingress, 4096)
    rig.send(UninstallRing(RingId(1), UninstallReason.EdgeStopped))
    assert rig.expect(RingQuiesced).ring_id == 1


def _stuck_step(rig: WorkerRig) -> None:
    """Step 1 of a grant echoing a 3-ring object into a one-ring egress ring nobody
    reads: it runs, fills the ring and waits for space."""
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    rig.add_ring(2, RingDirection.Egress, 4096)
    rig.send(ConfigureRole(RoleId(1), {"kind": "echo"}))
    rig.expect(RoleConfigured)
    rig.send(grant(1, 1, object_id=11))
    write_all(rig, ingress, record(10, 0, os.urandom(3 * 4096)))


def test_graceful_shutdown_finishes_the_running_step(rig: WorkerRig) -> None:
    _stuck_step(rig)
    rig.send(ShutdownWorker(ShutdownMode.Graceful))
    rig.send(grant(1, 9, sequence=1))
    assert rig.expect(StepFailed).reason is StepFailure.WorkerShuttingDown
    read_all(rig, rig.rings[2], ObjectHeader.LEN + 3 * 4096)
    done = rig.expect(StepCompleted)
    assert done.step_id == 1 and done.record is not None
    assert done.record.output_object_id == 11
    quiesced = {rig.expect(RingQuiesced).ring_id for _ in range(2)}
    assert quiesced == {1, 2}
    assert rig.expect(WorkerStopped).reason is WorkerStoppedReason.Graceful
    assert rig.wait_exit() == 0


def test_abort_in_flight_fails_the_running_step(rig: WorkerRig) -> None:
    _stuck_step(rig)
    rig.send(ShutdownWorker(ShutdownMode.AbortInFlight))
    failed = rig.expect(StepFailed)
    assert (failed.step_id, failed.reason) == (1, StepFailure.WorkerShuttingDown)
    quiesced = {rig.expect(RingQuiesced).ring_id for _ in range(2)}
    assert quiesced == {1, 2}
    assert rig.expect(WorkerStopped).reason is WorkerStoppedReason.AbortInFlight
    assert rig.wait_exit() == 0


def test_shared_ring_fault_mid_object_is_a_ring_fault(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    other = rig.add_ring(2, RingDirection.Ingress, 4096)
    write_all(rig, ingress, record(10, 0, os.urandom(2048))[:1000])  # mid-payload
    ingress.fault(RingFaultReason.WorkerShuttingDown)
    rig.send(RingReadable(RingId(1)))
    fault = rig.expect(RingFault)
    assert (fault.ring_id, fault.edge_id, fault.port_id) == (1, 101, 1)
    assert fault.reason is RingFaultReason.WorkerShuttingDown
    write_all(rig, other, record(20, 0, bytes(8)))
    assert rig.expect(ObjectLoaded).ring_id == 2
    rig.send(UninstallRing(RingId(1), UninstallReason.RingFaulted))
    assert rig.expect(RingQuiesced).ring_id == 1
