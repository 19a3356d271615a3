"""Edges whose rings live in a real GPU worker process; the worker is killed with -9.

Real: the memfd arena and ArenaManager, `python -m swactor.worker` under GpuWorkerCtl
(WorkerRingInstaller), the DriverActor on a loopback endpoint, the establisher and its
edge actors. After the kill GpuWorkerCtl reports every installed ring faulted; each
edge fails (RingFault), its teardown stops the pump, has the ring uninstalled
(answered WorkerReaped: the process is gone) and releases the lease with a
WorkerReaped proof, so no lease is left even though the worker never quiesced.
"""

from __future__ import annotations

import os
import signal

import pytest

from swactor.actors import Runtime
from swactor.edges import EdgeReleases, StopEdge
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import edge_teardown as et
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    Component,
    EdgeId,
    PortId,
    QuiescenceProofKind,
    RingFaultReason,
    RingId,
    RunFaultReason,
)
from tests.edges.rig import PRODUCER, RING, EdgeNode, rx, teardown_feed
from tests.edges.worker_rig import attach_worker, start_worker

EDGES = (1, 2)


async def test_worker_crash_faults_edges_and_teardown_releases_with_worker_reaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed = teardown_feed(monkeypatch)
    async with Runtime("node") as runtime:
        node = EdgeNode(runtime, "n", 1 << 20, NodeIdentity.generate())
        worker = attach_worker(runtime, node)
        routes = worker.routes
        await node.start(TransportConfig(), ())
        try:
            ready = await start_worker(node, worker)
            actors = [await node.provision(rx(edge, PRODUCER, RING), port=edge) for edge in EDGES]
            rings = [await node.owner.wait("ready", edge, timeout=30) for edge in EDGES]
            assert sorted(int(r) for r in routes.edges) == sorted(rings)
            assert len(await node.live_leases()) == 2

            os.kill(ready.pid, signal.SIGKILL)
            for edge in EDGES:
                reason, component = await node.owner.wait("failed", edge, timeout=30)
                assert (reason, component) == (RunFaultReason.RingFault, Component.Worker)
                await node.wait_state(edge, er.State.Failed, timeout=30)
            assert await node.live_leases() == []
            releases = await node.establisher.ask(EdgeReleases(), 5.0)
            assert sorted(releases) == sorted(
                (ring, QuiescenceProofKind.WorkerReaped) for ring in rings)
            # each teardown began with the worker's RingFault (§38 "on StopEdge or fault")
            assert sorted((int(m.edge_id), events[0]) for m, events in fed.items()) == [
                (edge, et.RingFault(RingId(ring), EdgeId(edge), PortId(edge),
                                    RingFaultReason.WorkerProcessExited))
                for edge, ring in zip(EDGES, rings, strict=True)]
            assert routes.edges == {}

            for edge, actor in zip(EDGES, actors, strict=True):
                actor.tell(StopEdge(EdgeId(edge)))
                assert await node.owner.wait("stopped", edge) is True
                assert await node.state(edge) is er.State.Stopped
        finally:
            await node.close()


async def test_stop_with_a_live_worker_releases_after_ring_quiesced() -> None:
    async with Runtime("node") as runtime:
        node = EdgeNode(runtime, "n", 1 << 20, NodeIdentity.generate())
        worker = attach_worker(runtime, node)
        await node.start(TransportConfig(), ())
        try:
            await start_worker(node, worker)
            actor = await node.provision(rx(1, PRODUCER, RING), port=1)
            ring = await node.owner.wait("ready", 1, timeout=30)
            actor.tell(StopEdge(EdgeId(1)))
            assert await node.owner.wait("stopped", 1, timeout=30) is True
            assert await node.live_leases() == []
            assert await node.establisher.ask(EdgeReleases(), 5.0) == [
                (ring, QuiescenceProofKind.PumpStoppedAndRingQuiesced)]
            assert node.owner.of("failed", 1) == []
        finally:
            await node.close()
