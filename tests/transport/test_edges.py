"""Edges over real QUIC on loopback: rendezvous, demux refusals, EOF, several edges."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.messages import (
    DriverEdgeReady,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamClosed,
    StreamFault,
)
from swactor.transport.pumps import SendPump
from swactor.wire.enums import StreamFaultReason
from swactor.wire.ids import EdgeId
from swactor.wire.objects import EdgePreamble
from tests.transport.fakering import FakeRing
from tests.transport.harness import Consumer, Node, make_pair, payload_chunks, produce

FAST = TransportConfig(
    max_datagram_size=16383,
    stream_window=256 << 10,
    edges_per_connection=4,
    connection_window=1 << 20,
    send_high_water=256 << 10,
)
pytestmark = pytest.mark.timeout(60)


async def _transfer(a: Node, b: Node, edge: int, total: int, recv_first: bool) -> None:
    tx, rx = FakeRing(256 << 10), FakeRing(256 << 10)
    chunks = payload_chunks(total, seed=edge)
    send = EstablishSend(edge, b.identity.node_id, 100 + edge, tx)
    recv = EstablishRecv(edge, 200 + edge, rx)
    if recv_first:
        b.driver.handle(recv)
        a.driver.handle(send)
    else:
        b.driver.expect_recv([edge])  # provisioned, not yet established locally
        a.driver.handle(send)
        producer = asyncio.create_task(produce(a, tx, 100 + edge, chunks))
        # The stream arrives and waits, unread, in pending_streams.
        async with asyncio.timeout(10):
            while edge not in b.driver.pending_streams:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        held = b.driver.pending_streams[edge].buffered
        assert held <= FAST.stream_window, "unpaired stream got more than one window"
        assert rx.commit == 0
        b.driver.handle(recv)
    consumer = Consumer(b, rx, 200 + edge)
    if recv_first:
        sent, got = await asyncio.gather(produce(a, tx, 100 + edge, chunks), consumer.drain())
    else:
        got = await consumer.drain()
        sent = await producer
    assert got == sent
    assert consumer.received == total
    closed = await b.wait_for(StreamClosed)
    assert closed == StreamClosed(edge, total)


@pytest.mark.parametrize("recv_first", [True, False], ids=["recv-first", "stream-first"])
async def test_rendezvous_in_either_order_delivers_every_byte(recv_first: bool) -> None:
    a, b = await make_pair(FAST)
    try:
        await _transfer(a, b, 5, 3 << 20, recv_first)
        assert DriverEdgeReady(5) in a.events and DriverEdgeReady(5) in b.events
        assert not a.of_type(StreamFault) and not b.of_type(StreamFault)
        assert PumpStopped(5, 205) in b.events
    finally:
        await a.close()
        await b.close()


async def _raw_stream(a: Node, b: Node) -> tuple[object, int]:
    link = await a.endpoint.connect(b.identity.node_id, EDGE_ALPN)
    return link, link.open_uni_stream()


async def test_unknown_edge_is_refused_and_reported() -> None:
    a, b = await make_pair(FAST)
    try:
        b.driver.expect_recv([1])
        rx = FakeRing(1 << 16)
        b.driver.handle(EstablishRecv(1, 11, rx))
        tx = FakeRing(1 << 16)
        a.driver.handle(EstablishSend(99, b.identity.node_id, 12, tx))
        await produce(a, tx, 12, [b"x" * 5000])
        fault = await b.wait_for(StreamFault)
        assert fault == StreamFault(99, StreamFaultReason.UnknownEdge, "edge not in active plan")
        assert rx.commit == 0 and 99 not in b.driver.pending_streams
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize(
    ("first_bytes", "reason"),
    [
        (b"SWED\x01\x00", StreamFaultReason.PreambleTruncated),
        (b"", StreamFaultReason.PreambleTruncated),
        (b"GARBAGE-GARBAGE-and-more", StreamFaultReason.PreambleGarbage),
        (b"SWED\x01\x00\x07\x00" + bytes(8), StreamFaultReason.PreambleGarbage),
    ],
    ids=["truncated", "empty", "bad-magic", "reserved-bits"],
)
async def test_bad_preamble_is_a_stream_fault(
    first_bytes: bytes, reason: StreamFaultReason
) -> None:
    a, b = await make_pair(FAST)
    try:
        rx = FakeRing(1 << 16)
        b.driver.handle(EstablishRecv(3, 13, rx))
        link, sid = await _raw_stream(a, b)
        link.send(sid, first_bytes, end=True)  # type: ignore[attr-defined]
        fault = await b.wait_for(StreamFault)
        assert isinstance(fault, StreamFault)
        assert (fault.edge_id, fault.reason) == (None, reason)
        assert rx.commit == 0
    finally:
        await a.close()
        await b.close()


async def test_eof_mid_stream_closes_with_offset_and_keeps_bytes() -> None:
    a, b = await make_pair(FAST)
    try:
        rx = FakeRing(1 << 16)
        b.driver.handle(EstablishRecv(4, 14, rx))
        link, sid = await _raw_stream(a, b)
        body = bytes(range(256)) * 4 + b"half-an-object"
        link.send(sid, EdgePreamble(edge_id=EdgeId(4)).pack() + body, end=True)  # type: ignore[attr-defined]
        closed = await b.wait_for(StreamClosed)
        assert closed == StreamClosed(4, len(body))
        assert rx.producer_closed() and bytes(rx.readable_span()) == body
    finally:
        await a.close()
        await b.close()


async def test_peer_reset_mid_stream_is_a_stream_fault() -> None:
    a, b = await make_pair(FAST)
    try:
        rx = FakeRing(1 << 16)
        b.driver.handle(EstablishRecv(6, 16, rx))
        link, sid = await _raw_stream(a, b)
        link.send(sid, EdgePreamble(edge_id=EdgeId(6)).pack() + b"abc")  # type: ignore[attr-defined]
        async with asyncio.timeout(5):
            while rx.commit < 3:
                await asyncio.sleep(0.01)
        link.reset_stream(sid)  # type: ignore[attr-defined]
        fault = await b.wait_for(StreamFault)
        assert isinstance(fault, StreamFault) and fault.reason == StreamFaultReason.PeerReset
        assert fault.edge_id == 6
        await b.wait_for(PumpStopped)
    finally:
        await a.close()
        await b.close()


async def test_several_edges_share_one_connection_and_one_stall_blocks_no_other() -> None:
    a, b = await make_pair(FAST)
    try:
        total = 2 << 20
        rings = {edge: (FakeRing(128 << 10), FakeRing(128 << 10)) for edge in (21, 22, 23)}
        for edge, (tx, rx) in rings.items():
            b.driver.handle(EstablishRecv(edge, 200 + edge, rx))
            a.driver.handle(EstablishSend(edge, b.identity.node_id, 100 + edge, tx))
        producers = {
            edge: asyncio.create_task(produce(a, tx, 100 + edge, payload_chunks(total, edge)))
            for edge, (tx, _) in rings.items()
        }
        flowing = [Consumer(b, rings[edge][1], 200 + edge) for edge in (21, 22)]
        digests = await asyncio.gather(*(c.drain() for c in flowing))
        for consumer, edge, digest in zip(flowing, (21, 22), digests, strict=True):
            assert consumer.received == total
            assert digest == await producers[edge]
        stalled_rx = rings[23][1]
        assert stalled_rx.commit == stalled_rx.capacity  # ring full, nobody drains it
        assert not producers[23].done()
        links = {pump.link for pump in a.driver.pumps.values() if isinstance(pump, SendPump)}
        assert len(links) == 1
        # Now drain the stalled edge: it completes too.
        late = Consumer(b, stalled_rx, 223)
        assert await late.drain() == await producers[23]
        assert late.received == total
    finally:
        await a.close()
        await b.close()


async def test_stop_edge_stops_the_pump_with_pump_stopped() -> None:
    a, b = await make_pair(FAST)
    try:
        tx, rx = FakeRing(1 << 16), FakeRing(1 << 16)
        b.driver.handle(EstablishRecv(8, 18, rx))
        a.driver.handle(EstablishSend(8, b.identity.node_id, 17, tx))
        producer = asyncio.create_task(produce(a, tx, 17, payload_chunks(1 << 20, 8)))
        async with asyncio.timeout(5):
            while rx.commit < rx.capacity:
                await asyncio.sleep(0.01)
        a.driver.handle(StopEdge(8))
        b.driver.handle(StopEdge(8))
        assert await a.wait_for(PumpStopped) == PumpStopped(8, 17)
        assert await b.wait_for(PumpStopped) == PumpStopped(8, 18)
        producer.cancel()
    finally:
        await a.close()
        await b.close()


def test_digest_helper_is_not_trivial() -> None:
    assert hashlib.sha256(b"".join(payload_chunks(3000, 1, 1000))).hexdigest() != hashlib.sha256(
        b"".join(payload_chunks(3000, 2, 1000))
    ).hexdigest()
