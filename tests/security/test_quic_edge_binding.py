"""Edge streams are bound to their producer (spec §4: a node rejects edge data that does
not match its plan): a pool peer the consumer admits, but that is not the edge's
producer, opens a stream naming the edge. It is refused with a typed
`StreamRefused(None, PeerNotAllowed)`, no byte of it reaches the ring, and the real
producer's stream, before or after it, is delivered whole with no fault on the edge.
Peers dropped from the allow-list lose their links and are refused when they return.

Three real endpoints on loopback (mutual TLS, real drivers, memfd rings).
"""

from __future__ import annotations

import asyncio

import pytest

from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.errors import PeerRejectedError
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import (
    EstablishRecv,
    EstablishSend,
    StreamClosed,
    StreamFault,
    StreamRefused,
)
from swactor.wire import EdgeId, EdgePreamble
from swactor.wire.enums import StreamFaultReason
from tests.transport.harness import Consumer, Node, make_node, payload_chunks, produce

pytestmark = pytest.mark.timeout(90)
CONFIG = TransportConfig(max_datagram_size=16383, handshake_timeout=5.0)
EDGE = 5
TOTAL = 3 << 20


async def _pool() -> tuple[Node, Node, Node]:
    """Producer a, consumer b, and c: a pool peer that b admits too."""
    ida, idb, idc = NodeIdentity.generate(), NodeIdentity.generate(), NodeIdentity.generate()
    a = await make_node(CONFIG, ida, allowed=(idb.node_id,))
    b = await make_node(CONFIG, idb, allowed=(ida.node_id, idc.node_id))
    c = await make_node(CONFIG, idc, allowed=(idb.node_id,))
    for sender in (a, c):
        sender.endpoint.address_book[idb.node_id] = b.endpoint.address
    return a, b, c


async def _intrude(c: Node, b: Node) -> None:
    """c opens an edge stream naming EDGE and sends bytes on it."""
    link = await c.endpoint.connect(b.identity.node_id, EDGE_ALPN)
    stream = link.open_uni_stream()
    preamble = EdgePreamble(edge_id=EdgeId(EDGE)).pack()  # type: ignore[attr-defined]
    link.send(stream, preamble + b"forged activations" * 1000)


async def _refusal(b: Node) -> StreamRefused:
    async with asyncio.timeout(10):
        while True:
            faults = [e for e in b.of_type(StreamRefused) if isinstance(e, StreamRefused)
                      and e.reason is StreamFaultReason.PeerNotAllowed]
            if faults:
                return faults[0]
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("intruder_first", [True, False], ids=["before", "during"])
async def test_a_stream_from_a_peer_that_is_not_the_producer_is_refused(
    intruder_first: bool,
) -> None:
    a, b, c = await _pool()
    try:
        rx_id, rx_layout, rx = b.new_ring(1 << 20)
        b.driver.handle(EstablishRecv(EDGE, a.identity.node_id, rx_id, rx_layout))
        tx_id, tx_layout, tx = a.new_ring(1 << 20)
        chunks = payload_chunks(TOTAL, seed=EDGE)
        consumer = Consumer(b, rx, rx_id)
        drain = asyncio.create_task(consumer.drain())
        if intruder_first:
            await _intrude(c, b)
            refusal = await _refusal(b)
        a.driver.handle(EstablishSend(EDGE, b.identity.node_id, tx_id, tx_layout))
        producing = asyncio.create_task(produce(a, tx, tx_id, chunks))
        if not intruder_first:
            while consumer.received == 0:  # the real stream is moving
                await asyncio.sleep(0.005)
            await _intrude(c, b)
            refusal = await _refusal(b)
        sent, got = await asyncio.wait_for(asyncio.gather(producing, drain), 30)
        # the victim: every byte of the real producer, in order, the edge closed cleanly
        assert got == sent and consumer.received == TOTAL
        assert StreamClosed(EDGE, TOTAL) in b.events
        # the refusal: typed, naming the edge and both nodes, not charged to the edge
        assert refusal.edge_id is None
        assert f"edge {EDGE} stream from node {c.identity.node_id:#018x}" in refusal.detail
        assert f"producer is node {a.identity.node_id:#018x}" in refusal.detail
        assert b.of_type(StreamFault) == [] and b.of_type(StreamRefused) == [refusal]
        assert b.driver.wrong_producer == 1
    finally:
        for node in (a, b, c):
            await node.close()


async def test_a_peer_dropped_from_the_allow_list_is_cut_off_and_refused() -> None:
    a, b, c = await _pool()
    try:
        link_c = await c.endpoint.connect(b.identity.node_id, EDGE_ALPN)
        link_a = await a.endpoint.connect(b.identity.node_id, EDGE_ALPN)
        dropped = b.endpoint.set_allowed({a.identity.node_id})  # the next session's pool
        assert dropped == [c.identity.node_id]
        async with asyncio.timeout(5):
            while not link_c.closed:
                await asyncio.sleep(0.01)
        assert "left the allow-list" in link_c.close_reason
        assert not link_a.closed
        # coming back: its handshake ends in b's refusal (the client learns it when b
        # closes the link, or already in the handshake)
        try:
            again = await c.endpoint.connect(b.identity.node_id, EDGE_ALPN)
        except PeerRejectedError:
            pass
        else:
            async with asyncio.timeout(5):
                while not again.closed:
                    await asyncio.sleep(0.01)
            assert "not in the allow-list" in again.close_reason
        assert b.endpoint.refused[-1].peer_node_id == c.identity.node_id
    finally:
        for node in (a, b, c):
            await node.close()
