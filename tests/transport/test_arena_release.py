"""A pump that ends while it waits leaves no view into its node's arena.

Each test stops a pump on a path where its task is asleep with the ring empty (sender) or
full (receiver) — connection lost, `StopEdge` before the producer closed, `StopEdge` on a
full ingress ring — then closes the driver, endpoint and ring handles and unmaps the arena
for real: `Arena.close` raises ArenaBusyError while any memoryview into the mapping is
alive, e.g. a span kept by a cancelled task's frame.
"""

from __future__ import annotations

import asyncio

import pytest

from swactor.transport.config import TransportConfig
from swactor.transport.messages import (
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamFault,
)
from swactor.wire import StreamFaultReason
from tests.transport.harness import Node, make_pair, payload_chunks, produce

CONFIG = TransportConfig(send_high_water=256 << 10)
EDGE = 12
pytestmark = pytest.mark.timeout(60)


def unmap(node: Node) -> None:
    """Unmap the arena of a closed node (ArenaBusyError while a view into it lives)."""
    node.arena.close()
    assert node.arena.closed


async def _idle_sender(a: Node, b: Node) -> int:
    """A Streaming edge whose sender drained everything and sleeps on an open, empty
    egress ring (its producer never closes)."""
    tx_id, tx_layout, tx = a.new_ring(1 << 16)
    rx_id, rx_layout, _ = b.new_ring(1 << 16)
    b.driver.handle(EstablishRecv(EDGE, a.identity.node_id, rx_id, rx_layout))
    a.driver.handle(EstablishSend(EDGE, b.identity.node_id, tx_id, tx_layout))
    await produce(a, tx, tx_id, [b"x" * 5000], close=False)
    async with asyncio.timeout(10):
        while tx.consume < 5000:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the drain task goes back to sleep on the empty ring
    return tx_id


async def test_sender_whose_connection_is_lost_leaves_no_view_into_its_arena() -> None:
    a, b = await make_pair(CONFIG)
    try:
        tx_id = await _idle_sender(a, b)
        await a.endpoint.close()
        fault = await a.wait_for(StreamFault)
        assert isinstance(fault, StreamFault) and fault.edge_id == EDGE
        assert fault.reason is StreamFaultReason.ConnectionLost
        assert await a.wait_for(PumpStopped) == PumpStopped(EDGE, tx_id)
    finally:
        await a.close()
        await b.close()
    unmap(a)


async def test_sender_stopped_before_its_producer_closed_leaves_no_view() -> None:
    a, b = await make_pair(CONFIG)
    try:
        tx_id = await _idle_sender(a, b)
        a.driver.handle(StopEdge(EDGE))
        assert await a.wait_for(PumpStopped) == PumpStopped(EDGE, tx_id)
    finally:
        await a.close()
        await b.close()
    unmap(a)


async def test_receiver_stopped_on_a_full_ring_leaves_no_view() -> None:
    a, b = await make_pair(CONFIG)
    try:
        tx_id, tx_layout, tx = a.new_ring(1 << 16)
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(EDGE, a.identity.node_id, rx_id, rx_layout))
        a.driver.handle(EstablishSend(EDGE, b.identity.node_id, tx_id, tx_layout))
        producer = asyncio.create_task(produce(a, tx, tx_id, payload_chunks(1 << 20, EDGE)))
        async with asyncio.timeout(10):
            while rx.commit < rx.capacity:  # nobody consumes: the recv pump sleeps
                await asyncio.sleep(0.01)
        b.driver.handle(StopEdge(EDGE))
        assert await b.wait_for(PumpStopped) == PumpStopped(EDGE, rx_id)
        producer.cancel()
    finally:
        await a.close()
        await b.close()
    unmap(b)
