"""The edge_record table, bound to the EdgeEstablisher's own record (its guards), decides
the run-level reason of a stream fault and names the fault its teardown is fed (spec §26,
§36, §38): the binding only carries the effects out."""

from __future__ import annotations

import pytest

from swactor.edges import ProvisionEdge
from swactor.edges.establisher import _Record
from swactor.fsm.generated import edge_record as er
from swactor.testing.examples import example
from swactor.wire import (
    EdgeId,
    LeaseRequestId,
    PortId,
    RingFaultReason,
    RingId,
    RingLayout,
    RunFaultReason,
    StreamFaultReason,
    UninstallReason,
)
from tests.edges.rig import tx

EDGE = EdgeId(7)
RING_ID = RingId(3)
PORT = PortId(1)


def ready_record(state: str) -> tuple[_Record, er.EdgeRecordMachine]:
    """The establisher's record for a Tx edge end, driven to `state` (its machine and
    guards only: no effect is carried out, so it needs no establisher or actor)."""
    rec = _Record(ProvisionEdge(tx(int(EDGE), 2), PORT, owner=None), LeaseRequestId(1), 30.0,
                  establisher=None, ctx=None)  # type: ignore[arg-type]
    machine = rec.machine
    machine.handle(er.ProvisionTx(EDGE, rec.provision.rx_node_id, rec.provision.object_spec,
                                  rec.provision.ring_spec))
    if state == "WaitingForLease":
        return rec, machine
    machine.handle(er.RingLeased(LeaseRequestId(1), RING_ID, example(RingLayout)))
    machine.handle(er.RingInstalled(RING_ID, EDGE, PORT))
    machine.handle(er.DriverEdgeReady(EDGE))
    assert machine.state is er.State.Ready
    return rec, machine


@pytest.mark.parametrize("state", ["WaitingForLease", "Ready"])
@pytest.mark.parametrize(("fault", "reason"), [
    (StreamFaultReason.HandshakeFailed, RunFaultReason.EdgeEstablishmentFailed),
    (StreamFaultReason.PeerNotAllowed, RunFaultReason.EdgeEstablishmentFailed),
    (StreamFaultReason.PumpFailed, RunFaultReason.PumpFailed),
    (StreamFaultReason.ConnectionLost, RunFaultReason.StreamFault),
    (StreamFaultReason.PeerReset, RunFaultReason.StreamFault),
])
def test_the_table_names_the_run_reason_of_a_stream_fault(
    state: str, fault: StreamFaultReason, reason: RunFaultReason
) -> None:
    _, machine = ready_record(state)
    effects = machine.handle(er.StreamFault(EDGE, fault))
    failed = [e for e in effects if isinstance(e, er.NotifyEdgeFailed)]
    assert failed == [er.NotifyEdgeFailed(EDGE, reason)]


def test_a_stream_fault_starts_a_teardown_fed_that_fault() -> None:
    _, machine = ready_record("Ready")
    effects = machine.handle(er.StreamFault(EDGE, StreamFaultReason.ConnectionLost))
    assert effects[-1] == er.StartTeardownOnStreamFault(
        EDGE, StreamFaultReason.ConnectionLost, UninstallReason.EdgeStopped)
    assert machine.state is er.State.StoppingAfterFault


def test_a_ring_fault_starts_a_teardown_fed_that_fault() -> None:
    _, machine = ready_record("Ready")
    effects = machine.handle(
        er.RingFault(RING_ID, EDGE, PORT, RingFaultReason.WorkerProcessExited))
    assert effects == [
        er.NotifyEdgeFailed(EDGE, RunFaultReason.RingFault),
        er.StartTeardownOnRingFault(RING_ID, EDGE, PORT, RingFaultReason.WorkerProcessExited,
                                    UninstallReason.RingFaulted),
    ]
