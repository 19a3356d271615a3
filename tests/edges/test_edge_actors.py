"""The Tx/Rx edge actors alone: mail in, owner reports and forwarded commands out.

The actors are real; their establisher and GpuWorkerCtl are collectors (the actors are
the unit under test), their owner a RecordingOwner. Also: StageOwner's mapping onto the
StageController's mail.
"""

from __future__ import annotations

import asyncio
from typing import Any

from swactor.actors import Runtime
from swactor.edges import (
    EdgeDown,
    EdgeGone,
    EdgeUp,
    RxEdgeActor,
    StageOwner,
    StopEdgeRequest,
    TxEdgeActor,
)
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import rx_edge as rx
from swactor.fsm.generated import stage_controller as scm
from swactor.fsm.generated import tx_edge as tx
from swactor.node.stage_ports import EdgeEstablished
from swactor.wire import (
    Component,
    DeviceObjectHandle,
    EdgeId,
    ObjectFailed,
    ObjectFailure,
    ObjectId,
    ObjectLoaded,
    ObjectProduced,
    PortId,
    RingId,
    RunFaultReason,
    Sequence,
    WorkerGeneration,
)
from tests.edges.rig import RecordingOwner
from tests.worker.ctl_rig import Collector

EDGE, RING = EdgeId(4), RingId(9)


def loaded(object_id: int, handle: int) -> ObjectLoaded:
    return ObjectLoaded(RING, EDGE, PortId(1), ObjectId(object_id), Sequence(object_id), 8,
                        DeviceObjectHandle(WorkerGeneration(1), handle))


def produced(object_id: int) -> ObjectProduced:
    return ObjectProduced(RING, EDGE, PortId(1), ObjectId(object_id), Sequence(object_id), 8)


async def settle(owner: RecordingOwner, count: int) -> None:
    async with asyncio.timeout(5):
        while len(owner.reports) < count:
            owner.changed.clear()
            await owner.changed.wait()


async def test_tx_actor_reports_produced_objects_and_a_sequence_violation() -> None:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    owner = RecordingOwner()
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(inbox), "establisher")
        actor = runtime.spawn(lambda: TxEdgeActor(EDGE, owner, establisher))
        actor.tell(produced(1))  # not Producing
        actor.tell(EdgeUp(EDGE, RING))
        actor.tell(tx.ProduceObject(EDGE, ObjectId(1), Sequence(0)))
        actor.tell(produced(1))
        actor.tell(tx.ProduceObject(EDGE, ObjectId(2), Sequence(1)))
        actor.tell(produced(3))
        await settle(owner, 3)
        assert owner.reports == [
            ("ready", 4, 9), ("produced", 4, 1),
            ("failed", 4, (RunFaultReason.SequenceViolation, Component.TxEdge))]

        actor.tell(StopEdgeRequest(EDGE))
        assert await asyncio.wait_for(inbox.get(), 5) == er.StopEdge(EDGE)
        actor.tell(EdgeGone(EDGE, False))
        await asyncio.wait_for(actor.join(), 5)
        assert owner.reports[-1] == ("stopped", 4, False)


async def test_rx_actor_delivers_one_object_at_a_time_and_discards_after_a_fault() -> None:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    worker: asyncio.Queue[Any] = asyncio.Queue()
    owner = RecordingOwner()
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(inbox), "establisher")
        ctl = runtime.spawn(lambda: Collector(worker), "worker")
        actor = runtime.spawn(lambda: RxEdgeActor(EDGE, owner, establisher, ctl))
        actor.tell(EdgeUp(EDGE, RING))
        actor.tell(loaded(1, 100))
        actor.tell(rx.ObjectConsumed(EDGE, ObjectId(1)))
        actor.tell(loaded(2, 101))
        actor.tell(loaded(3, 102))  # a second object while one is held
        await settle(owner, 4)
        assert owner.reports == [
            ("ready", 4, 9), ("loaded", 4, 1), ("loaded", 4, 2),
            ("failed", 4, (RunFaultReason.SequenceViolation, Component.RxEdge))]
        assert (await asyncio.wait_for(worker.get(), 5)) == gwc.ReleaseDeviceObject(
            DeviceObjectHandle(WorkerGeneration(1), 102))
        actor.tell(loaded(4, 103))  # Faulted: released, not delivered
        assert (await asyncio.wait_for(worker.get(), 5)).device_handle.id == 103
        actor.tell(ObjectFailed(RING, EDGE, PortId(1), None, None, ObjectFailure.EofMidObject))
        actor.tell(StopEdgeRequest(EDGE))
        assert await asyncio.wait_for(inbox.get(), 5) == er.StopEdge(EDGE)
        actor.tell(EdgeGone(EDGE, True))
        await asyncio.wait_for(actor.join(), 5)
        assert owner.reports[4:] == [("stopped", 4, True)]


async def test_edge_failure_reaches_the_owner_with_its_component() -> None:
    owner = RecordingOwner()
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(asyncio.Queue()), "establisher")
        actor = runtime.spawn(lambda: RxEdgeActor(EDGE, owner, establisher))
        actor.tell(EdgeDown(EDGE, RunFaultReason.ArenaPressureTimeout))
        actor.tell(EdgeUp(EDGE, RING))  # late: ignored in Faulted
        await settle(owner, 1)
        await asyncio.sleep(0.05)
        assert owner.reports == [
            ("failed", 4, (RunFaultReason.ArenaPressureTimeout, Component.ArenaManager))]


async def test_stage_owner_speaks_the_stage_controllers_mail() -> None:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("edges") as runtime:
        owner = StageOwner(runtime.spawn(lambda: Collector(inbox), "stage"))
        owner.edge_ready(EDGE, RING)
        owner.object_produced(EDGE, ObjectId(1))  # the controller has it from the worker
        owner.edge_failed(EDGE, RunFaultReason.RingFault, Component.Worker)
        owner.edge_stopped(EDGE, True)
        got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(3)]
        assert got == [EdgeEstablished(EDGE, RING),
                       scm.EdgeFault(EDGE, RunFaultReason.RingFault, Component.Worker),
                       scm.EdgeStopped(EDGE, True)]
        assert inbox.empty()
