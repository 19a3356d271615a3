"""One edge from a token endpoint's egress ring, over loopback QUIC, into a real worker.

Node A (the orchestrator side) provisions the Tx end with a LocalRingInstaller; node B
provisions the Rx end with its ring installed in `python -m swactor.worker` under
GpuWorkerCtl. Object records written into A's egress ring cross QUIC into B's ingress
ring, the worker loads each one and its ObjectLoaded reaches the stage controller that
GpuWorkerCtl routes object events to (a collector here), not the Rx edge actor's owner.
Wake hints go both ways through the DriverActor, GpuWorkerCtl and its eventfd doorbells.
A clean stop then releases both leases.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from swactor.actors import Runtime
from swactor.edges import StopEdge
from swactor.testing.worker_rig import record
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import EdgeId, ObjectLoaded, RingId, RingReadable
from tests.edges.rig import EdgeNode, rx, tx
from tests.edges.worker_rig import attach_worker, start_worker
from tests.worker.ctl_rig import Collector, take

EDGE = EdgeId(21)
OBJECTS = 3


async def test_objects_cross_quic_into_a_real_worker_and_reach_the_stage_controller() -> None:
    async with Runtime("nodes") as runtime:
        ida, idb = NodeIdentity.generate(), NodeIdentity.generate()
        a = EdgeNode(runtime, "a", 8 << 20, ida)
        b = EdgeNode(runtime, "b", 8 << 20, idb)
        worker = attach_worker(runtime, b)
        stage: asyncio.Queue[Any] = asyncio.Queue()
        worker.routes.stage_controllers.append(runtime.spawn(lambda: Collector(stage), "stage"))
        await a.start(TransportConfig(), (idb.node_id,))
        await b.start(TransportConfig(), (ida.node_id,))
        a.endpoint.address_book[idb.node_id] = b.endpoint.address
        try:
            await start_worker(b, worker)
            tx_actor = await a.provision(tx(EDGE, idb.node_id))
            rx_actor = await b.provision(rx(EDGE, a.identity.node_id), port=1)
            ring_a = await a.owner.wait("ready", EDGE, timeout=30)
            await b.owner.wait("ready", EDGE, timeout=30)

            egress = a.local.ring(EDGE)
            for n in range(OBJECTS):
                data = record(n + 1, n, os.urandom(4 * 64))
                written, must_wake = egress.write_from(data)
                assert written == len(data)  # the 64 KiB ring has room for all three
                if must_wake:
                    a.driver.tell(RingReadable(RingId(ring_a)))
                loaded = await take(stage, ObjectLoaded, timeout=30)
                assert (loaded.edge_id, loaded.object_id, loaded.sequence) == (EDGE, n + 1, n)
            assert a.owner.of("failed", EDGE) == [] and b.owner.of("failed", EDGE) == []
            egress.close_producer()  # the endpoint's clean end of the stream (FIN)
            if egress.mark_readable_pending():
                a.driver.tell(RingReadable(RingId(ring_a)))
            await a.wait_sent(EDGE)

            tx_actor.tell(StopEdge(EDGE))
            rx_actor.tell(StopEdge(EDGE))
            assert await a.owner.wait("stopped", EDGE) is True
            assert await b.owner.wait("stopped", EDGE, timeout=30) is True
            assert await a.live_leases() == [] and await b.live_leases() == []
        finally:
            await a.close()
            await b.close()
