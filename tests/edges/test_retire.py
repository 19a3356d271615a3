"""The EdgeEstablisher forgets an edge once its record is Stopped (no per-run growth).

Edge ids are drawn per run, so a node that kept every Stopped record kept each past
run's record, machines and edge actor cell for its whole life (`just soak`: node RSS
grew with the number of runs). Real: arena, ArenaManager, DriverActor on a loopback
QUIC endpoint, the establisher and its edge actors; the far end is the local installer.
The count is of live objects in this process (`gc`), so it sees any index that still
holds a record, whatever its name.
"""

from __future__ import annotations

import gc

import pytest

from swactor.actors import Runtime
from swactor.actors.cell import ActorCell
from swactor.edges import EdgeReleases, EdgeStates, StopEdge, establisher
from swactor.edges.establisher import _Record
from swactor.fsm.generated import edge_record as er
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import EdgeId
from tests.edges.rig import PRODUCER, RING, EdgeNode, rx

CYCLES = 12


def live(kind: type) -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if type(item) is kind)


async def one_edge(node: EdgeNode, edge: int) -> None:
    """Provision an Rx edge, see it ready, stop it, see it stopped."""
    actor = await node.provision(rx(edge, PRODUCER))
    await node.owner.wait("ready", edge)
    actor.tell(StopEdge(EdgeId(edge)))
    assert await node.owner.wait("stopped", edge) is True
    await actor.join()


async def test_stopped_records_and_edge_actors_are_dropped() -> None:
    async with Runtime("edges") as runtime:
        node = EdgeNode(runtime, "n", 4 * (4096 + RING), NodeIdentity.generate())
        await node.start(TransportConfig(), ())
        try:
            await one_edge(node, 1)
            records, cells = live(_Record), live(ActorCell)
            for edge in range(2, 2 + CYCLES):
                await one_edge(node, edge)
            assert live(_Record) == records == 0
            assert live(ActorCell) == cells
            # a retired edge still answers Stopped; nothing is leased
            assert await node.state(2) is er.State.Stopped
            assert await node.state(1 + CYCLES) is er.State.Stopped
            assert await node.live_leases() == []
        finally:
            await node.close()


async def test_memory_of_retired_edges_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(establisher, "RETIRED_KEPT", 3)
    async with Runtime("edges") as runtime:
        node = EdgeNode(runtime, "n", 4 * (4096 + RING), NodeIdentity.generate())
        await node.start(TransportConfig(), ())
        try:
            for edge in range(1, 8):
                await one_edge(node, edge)
            states = await node.establisher.ask(EdgeStates(), 5.0)
            assert states == dict.fromkeys((5, 6, 7), er.State.Stopped)
            releases = await node.establisher.ask(EdgeReleases(), 5.0)
            assert len(releases) == 3  # the last three rings released
        finally:
            await node.close()
