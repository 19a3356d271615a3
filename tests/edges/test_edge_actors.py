"""The Tx/Rx edge actors alone: mail in, owner reports and forwarded commands out.

The actors are real; their establisher and GpuWorkerCtl are collectors (the actors are
the unit under test), their owner a RecordingOwner. Also: StageOwner's mapping onto the
StageController's mail.
"""

from __future__ import annotations

import asyncio
from typing import Any, get_args

import pytest

from swactor.actors import Runtime
from swactor.edges import (
    RxEdgeActor,
    StageOwner,
    StopEdge,
    TxEdgeActor,
)
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import rx_edge as rx
from swactor.fsm.generated import stage_controller as scm
from swactor.fsm.generated import tx_edge as tx
from swactor.wire import (
    Component,
    DeviceObjectHandle,
    EdgeFailed,
    EdgeId,
    EdgeReady,
    EdgeStopped,
    ObjectFailed,
    ObjectFailure,
    ObjectId,
    ObjectLoaded,
    ObjectProduced,
    PortId,
    RingId,
    RunFaultReason,
    Sequence,
    StreamFault,
    StreamFaultReason,
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


async def test_edge_actors_let_objects_pass_them_by() -> None:
    """Objects go from GpuWorkerCtl to the StageController, not through the edge actors
    (rx_edge.yaml, tx_edge.yaml): a worker object event is not an edge actor's event."""
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    owners = {"tx": RecordingOwner(), "rx": RecordingOwner()}
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(inbox), "establisher")
        actors = {"tx": runtime.spawn(lambda: TxEdgeActor(EDGE, owners["tx"], establisher)),
                  "rx": runtime.spawn(lambda: RxEdgeActor(EDGE, owners["rx"], establisher))}
        for name, actor in actors.items():
            actor.tell(EdgeReady(EDGE, RING))
            for mail in (loaded(1, 100), produced(1), loaded(2, 101), loaded(3, 102),
                         ObjectFailed(RING, EDGE, PortId(1), None, None,
                                      ObjectFailure.EofMidObject)):
                actor.tell(mail)
            actor.tell(StopEdge(EDGE))
            assert await asyncio.wait_for(inbox.get(), 5) == er.StopEdge(EDGE)
            actor.tell(EdgeStopped(EDGE, True))
            await asyncio.wait_for(actor.join(), 5)
            assert owners[name].reports == [("ready", 4, 9), ("stopped", 4, True)], name
    assert rx.State.__members__.keys() == {"Provisioning", "Ready", "Faulted", "Stopping",
                                           "Stopped"}
    assert tx.State.__members__.keys() == rx.State.__members__.keys()


async def test_edge_failure_reaches_the_owner_with_its_component() -> None:
    owner = RecordingOwner()
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(asyncio.Queue()), "establisher")
        actor = runtime.spawn(lambda: RxEdgeActor(EDGE, owner, establisher))
        actor.tell(EdgeFailed(EDGE, RunFaultReason.ArenaPressureTimeout))
        actor.tell(EdgeReady(EDGE, RING))  # late: ignored in Faulted
        await settle(owner, 1)
        await asyncio.sleep(0.05)
        assert owner.reports == [
            ("failed", 4, (RunFaultReason.ArenaPressureTimeout, Component.ArenaManager))]


@pytest.mark.parametrize("actor_class", [TxEdgeActor, RxEdgeActor])
async def test_the_edge_record_not_the_actor_decides_a_stream_faults_reason(
    actor_class: type[TxEdgeActor] | type[RxEdgeActor],
) -> None:
    """A driver StreamFault is the edge record's event (its table picks PumpFailed,
    EdgeEstablishmentFailed or StreamFault): the actor maps none itself, and reports
    the reason of the record's EdgeFailed."""
    owner = RecordingOwner()
    async with Runtime("edges") as runtime:
        establisher = runtime.spawn(lambda: Collector(asyncio.Queue()), "establisher")
        actor = runtime.spawn(lambda: actor_class(EDGE, owner, establisher))
        actor.tell(EdgeReady(EDGE, RING))
        actor.tell(StreamFault(EDGE, StreamFaultReason.PumpFailed))  # not the actor's mail
        actor.tell(EdgeFailed(EDGE, RunFaultReason.PumpFailed))  # what the record decided
        await settle(owner, 2)
        await asyncio.sleep(0.05)
        assert owner.reports == [
            ("ready", 4, 9), ("failed", 4, (RunFaultReason.PumpFailed, Component.Driver))]
    assert StreamFault not in (*get_args(tx.Event), *get_args(rx.Event))


async def test_stage_owner_speaks_the_stage_controllers_mail() -> None:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("edges") as runtime:
        owner = StageOwner(runtime.spawn(lambda: Collector(inbox), "stage"))
        owner.edge_ready(EDGE, RING)
        owner.edge_failed(EDGE, RunFaultReason.RingFault, Component.Worker)
        owner.edge_stopped(EDGE, True)
        got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(3)]
        assert got == [EdgeReady(EDGE, RING),
                       scm.EdgeFault(EDGE, RunFaultReason.RingFault, Component.Worker),
                       scm.EdgeStopped(EDGE, True)]
        assert inbox.empty()
