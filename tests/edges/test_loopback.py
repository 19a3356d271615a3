"""A Tx and an Rx edge on two loopback QUIC endpoints, through real establishers.

Real: memfd arenas, ArenaManagers, cffi rings, QUIC (aioquic, mutual TLS), Drivers,
EdgeEstablishers and edge actors. The ring far ends are the local (token endpoint)
installers, so the test itself plays producer and consumer on the rings.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from swactor.actors import Runtime
from swactor.edges import StopEdge
from swactor.events.emitter import Emitter
from swactor.events.schema import EdgeReady, validate_line
from swactor.fsm.generated import edge_record as er
from swactor.ring import Ring
from swactor.wire import EdgeId, NodeId, RingId, RingReadable, RingWritable, RunId
from tests.edges.rig import EdgeNode, node_pair, rx, tx

EDGE = EdgeId(7)
RUN = 5
PAYLOAD = 3 << 20  # larger than the 64 KiB rings: wraps and backpressure both ways


async def write_all(node: EdgeNode, ring: Ring, ring_id: int, data: bytes) -> None:
    view = memoryview(data)
    wake = node.local.wake_event(ring_id)
    while view:
        n, must_wake = ring.write_from(view)
        view = view[n:]
        if must_wake:
            node.driver.tell(RingReadable(RingId(ring_id)))
        if n == 0:
            wake.clear()
            ring.clear_writable_pending()
            if not len(ring.writable_span()):
                await asyncio.wait_for(wake.wait(), 10.0)
    ring.close_producer()
    if ring.mark_readable_pending():
        node.driver.tell(RingReadable(RingId(ring_id)))


async def read_n(node: EdgeNode, ring: Ring, ring_id: int, total: int) -> bytes:
    out = bytearray()
    buf = bytearray(1 << 16)
    wake = node.local.wake_event(ring_id)
    while len(out) < total:
        n, must_wake = ring.read_into(memoryview(buf)[: total - len(out)])
        out += buf[:n]
        if must_wake:
            node.driver.tell(RingWritable(RingId(ring_id)))
        if n == 0:
            wake.clear()
            ring.clear_readable_pending()
            if not len(ring.readable_span()):
                await asyncio.wait_for(wake.wait(), 10.0)
    return bytes(out)


@pytest.mark.parametrize("rx_first", [True, False], ids=["rx-first", "tx-first"])
async def test_edge_ready_in_either_order_and_bytes_arrive(rx_first: bool) -> None:
    async with Runtime("edges") as runtime:
        a, b = await node_pair(runtime)
        try:
            if rx_first:
                rx_actor = await b.provision(rx(EDGE, a.identity.node_id), run_id=RUN)
                await b.wait_state(EDGE, er.State.Ready)
                tx_actor = await a.provision(tx(EDGE, b.identity.node_id), run_id=RUN)
            else:
                tx_actor = await a.provision(tx(EDGE, b.identity.node_id), run_id=RUN)
                await a.wait_state(EDGE, er.State.Ready)
                rx_actor = await b.provision(rx(EDGE, a.identity.node_id), run_id=RUN)
            ring_a = await a.owner.wait("ready", EDGE)
            ring_b = await b.owner.wait("ready", EDGE)
            assert await a.state(EDGE) is er.State.Ready
            assert await b.state(EDGE) is er.State.Ready
            assert [lease.ring_id for lease in await a.live_leases()] == [ring_a]
            assert [lease.ring_id for lease in await b.live_leases()] == [ring_b]
            for node, ring in ((a, ring_a), (b, ring_b)):
                assert node.events == [EdgeReady(node_id=NodeId(node.identity.node_id),
                                                 run_id=RunId(RUN), edge_id=EDGE,
                                                 ring_id=RingId(ring))]
                validate_line(Emitter("edges-test", []).emit(node.events[0]).to_line())

            data = os.urandom(PAYLOAD)
            egress, ingress = a.local.ring(EDGE), b.local.ring(EDGE)
            got, _ = await asyncio.gather(read_n(b, ingress, ring_b, len(data)),
                                          write_all(a, egress, ring_a, data))
            assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()

            tx_actor.tell(StopEdge(EDGE))
            rx_actor.tell(StopEdge(EDGE))
            assert await a.owner.wait("stopped", EDGE) is True
            assert await b.owner.wait("stopped", EDGE) is True
            assert await a.live_leases() == [] and await b.live_leases() == []
            assert a.owner.of("failed", EDGE) == [] and b.owner.of("failed", EDGE) == []
            await tx_actor.join()
            await rx_actor.join()
        finally:
            await a.close()
            await b.close()
