"""EdgeStagePorts against a real establisher: a stage's inbound and outbound edge ends
are established and stopped, answered in the StageController's own mail."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from swactor.actors import Runtime
from swactor.edges import EdgeStagePorts
from swactor.fsm.generated import stage_controller as scm
from swactor.testing.examples import example
from swactor.wire import (
    EdgeId,
    EdgeReady,
    NodeId,
    ObjectId,
    ObjectLoaded,
    ObjectProduced,
    ProvisionStage,
    RunFaultError,
    RunFaultReason,
    Sequence,
)
from tests.edges.rig import node_pair
from tests.worker.ctl_rig import Collector


async def next_of(inbox: asyncio.Queue[Any], count: int) -> list[Any]:
    return [await asyncio.wait_for(inbox.get(), 10) for _ in range(count)]


async def test_stage_edges_are_established_and_stopped_clean() -> None:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    async with Runtime("edges") as runtime:
        a, b = await node_pair(runtime)
        try:
            base = example(ProvisionStage)
            provision = dataclasses.replace(base, outbound=dataclasses.replace(
                base.outbound, consumer_node_id=NodeId(b.identity.node_id)))
            stage = runtime.spawn(lambda: Collector(inbox), "stage")
            ports = EdgeStagePorts(a.establisher, stage)
            await ports.establish_inbound(provision)
            await ports.establish_outbound(provision)
            inbound, outbound = provision.inbound.edge_id, provision.outbound.edge_id
            ready = await next_of(inbox, 2)
            assert sorted(int(m.edge_id) for m in ready) == sorted([inbound, outbound])
            assert all(isinstance(m, EdgeReady) for m in ready)
            assert len(await a.live_leases()) == 2

            with pytest.raises(RunFaultError) as refused:
                await ports.establish_inbound(provision)  # the edge id is taken
            assert refused.value.reason is RunFaultReason.EdgeEstablishmentFailed

            await ports.stop_edges(inbound, outbound)
            stopped = await next_of(inbox, 2)
            assert sorted(stopped, key=lambda m: int(m.edge_id)) == sorted(
                [scm.EdgeStopped(inbound, True), scm.EdgeStopped(outbound, True)],
                key=lambda m: int(m.edge_id))
            assert await a.live_leases() == []

            await ports.stop_edges(EdgeId(90), EdgeId(91))  # never provisioned
            assert await next_of(inbox, 2) == [scm.EdgeStopped(EdgeId(90), True),
                                               scm.EdgeStopped(EdgeId(91), True)]
        finally:
            await a.close()
            await b.close()


def _loaded(number: int) -> ObjectLoaded:
    base = example(ObjectLoaded)
    return dataclasses.replace(base, object_id=ObjectId(number), sequence=Sequence(number),
                               device_handle=dataclasses.replace(base.device_handle,
                                                                 id=number))


def _produced(number: int) -> ObjectProduced:
    return dataclasses.replace(example(ObjectProduced), object_id=ObjectId(number + 1),
                               sequence=Sequence(number))


def _drain(inbox: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not inbox.empty():
        items.append(inbox.get_nowait())
    return items
