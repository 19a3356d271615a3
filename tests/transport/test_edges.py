"""Edges over real QUIC on loopback: rendezvous, demux refusals, EOF, several edges."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import socket
import weakref
from typing import Any

import pytest

from swactor.ring import Ring, RingState
from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.errors import TransportError
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import (
    DriverEdgeReady,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamClosed,
    StreamFault,
    StreamRefused,
)
from swactor.wire import EdgeId, EdgePreamble, RingFaultReason, StreamFaultReason
from swactor.wire.objects import PREAMBLE_LEN
from tests.transport.harness import Consumer, Node, make_node, make_pair, payload_chunks, produce

FAST = TransportConfig(
    max_datagram_size=16383,
    stream_window=256 << 10,
    edges_per_connection=4,
    connection_window=1 << 20,
    send_high_water=256 << 10,
)
pytestmark = pytest.mark.timeout(60)


async def _transfer(a: Node, b: Node, edge: int, total: int, recv_first: bool) -> None:
    tx_id, tx_layout, tx = a.new_ring(256 << 10)
    rx_id, rx_layout, rx = b.new_ring(256 << 10)
    chunks = payload_chunks(total, seed=edge)
    send = EstablishSend(edge, b.identity.node_id, tx_id, tx_layout)
    recv = EstablishRecv(edge, a.identity.node_id, rx_id, rx_layout)
    if recv_first:
        b.driver.handle(recv)
        a.driver.handle(send)
    else:
        # provisioned, not yet established locally
        b.driver.expect_recv([(edge, a.identity.node_id)])
        a.driver.handle(send)
        producer = asyncio.create_task(produce(a, tx, tx_id, chunks))
        # The stream arrives and waits, unread, in pending_streams.
        async with asyncio.timeout(10):
            while edge not in b.driver.pending_streams:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        held = b.driver.pending_streams[edge].buffered
        assert held <= FAST.stream_window, "unpaired stream got more than one window"
        assert rx.commit == 0
        b.driver.handle(recv)
    consumer = Consumer(b, rx, rx_id)
    if recv_first:
        sent, got = await asyncio.gather(produce(a, tx, tx_id, chunks), consumer.drain())
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
        assert PumpStopped(5, 1) in b.events and PumpStopped(5, 1) in a.events
    finally:
        await a.close()
        await b.close()


async def _full_edge(a: Node, b: Node, edge: int) -> tuple[int, int, Ring, asyncio.Task[Any]]:
    """Edge `edge` from a to b, established on both ends, its producer streaming 1 MiB into
    64 KiB rings, returned once b's ring is full (mid-transfer: the sender has more to
    send): (tx ring id, rx ring id, b's ring, the producer task)."""
    tx_id, tx_layout, tx = a.new_ring(1 << 16)
    rx_id, rx_layout, rx = b.new_ring(1 << 16)
    b.driver.handle(EstablishRecv(edge, a.identity.node_id, rx_id, rx_layout))
    a.driver.handle(EstablishSend(edge, b.identity.node_id, tx_id, tx_layout))
    producer = asyncio.create_task(produce(a, tx, tx_id, payload_chunks(1 << 20, edge)))
    async with asyncio.timeout(5):
        while rx.commit < rx.capacity:
            await asyncio.sleep(0.01)
    return tx_id, rx_id, rx, producer


async def _raw_stream(a: Node, b: Node) -> tuple[object, int]:
    link = await a.endpoint.connect(b.identity.node_id, EDGE_ALPN)
    return link, link.open_uni_stream()


async def test_unknown_edge_is_refused_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    a, b = await make_pair(FAST)
    try:
        b.driver.expect_recv([(1, a.identity.node_id)])
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(1, a.identity.node_id, rx_id, rx_layout))
        tx_id, tx_layout, tx = a.new_ring(1 << 16)
        a.driver.handle(EstablishSend(99, b.identity.node_id, tx_id, tx_layout))
        await produce(a, tx, tx_id, [b"x" * 5000], close=False)
        fault = await b.wait_for(StreamRefused)
        assert fault == StreamRefused(99, StreamFaultReason.UnknownEdge, "edge not in active plan")
        # the refusal stops the stream with the abort code: no graceful stop, the sender
        # (still streaming: its producer is open) faults
        refused = await a.wait_for(StreamFault)
        assert isinstance(refused, StreamFault)
        assert refused == StreamFault(EdgeId(99), StreamFaultReason.PeerReset), refused
        assert "edge 99: stream fault PeerReset" in caplog.text and "0x5a03" in caplog.text
        assert not a.of_type(StreamClosed)
        assert rx.commit == 0 and 99 not in b.driver.pending_streams
        b_link = b.endpoint.cached(a.identity.node_id, EDGE_ALPN)
        assert b_link is not None
        async with asyncio.timeout(5):  # the refused bytes gave their credit back
            while b_link.quic.received_unconsumed():
                await asyncio.sleep(0.01)
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
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(3, a.identity.node_id, rx_id, rx_layout))
        link, sid = await _raw_stream(a, b)
        link.send(sid, first_bytes, end=True)  # type: ignore[attr-defined]
        fault = await b.wait_for(StreamRefused)
        assert isinstance(fault, StreamRefused)
        assert (fault.edge_id, fault.reason) == (None, reason)
        assert rx.commit == 0
    finally:
        await a.close()
        await b.close()


async def test_eof_mid_stream_closes_with_offset_and_keeps_bytes() -> None:
    a, b = await make_pair(FAST)
    try:
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(4, a.identity.node_id, rx_id, rx_layout))
        link, sid = await _raw_stream(a, b)
        body = bytes(range(256)) * 4 + b"half-an-object"
        link.send(sid, EdgePreamble(edge_id=EdgeId(4)).pack() + body, end=True)  # type: ignore[attr-defined]
        closed = await b.wait_for(StreamClosed)
        assert closed == StreamClosed(4, len(body))
        assert rx.state is RingState.Closed and bytes(rx.readable_span()) == body
    finally:
        await a.close()
        await b.close()


async def test_peer_reset_mid_stream_is_a_stream_fault() -> None:
    a, b = await make_pair(FAST)
    try:
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(6, a.identity.node_id, rx_id, rx_layout))
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
        rings = {edge: (a.new_ring(128 << 10), b.new_ring(128 << 10)) for edge in (21, 22, 23)}
        for edge, ((tx_id, tx_layout, _), (rx_id, rx_layout, _)) in rings.items():
            b.driver.handle(EstablishRecv(edge, a.identity.node_id, rx_id, rx_layout))
            a.driver.handle(EstablishSend(edge, b.identity.node_id, tx_id, tx_layout))
        producers = {
            edge: asyncio.create_task(produce(a, tx[2], tx[0], payload_chunks(total, edge)))
            for edge, (tx, _) in rings.items()
        }
        flowing = [Consumer(b, rings[edge][1][2], rings[edge][1][0]) for edge in (21, 22)]
        digests = await asyncio.gather(*(c.drain() for c in flowing))
        for consumer, edge, digest in zip(flowing, (21, 22), digests, strict=True):
            assert consumer.received == total
            assert digest == await producers[edge]
        stalled_id, _, stalled_rx = rings[23][1]
        assert stalled_rx.commit == stalled_rx.capacity  # ring full, nobody drains it
        assert not producers[23].done()
        links = {send.link for send in a.driver.send_edges.values()}
        assert len(links) == 1 and None not in links
        # Now drain the stalled edge: it completes too.
        late = Consumer(b, stalled_rx, stalled_id)
        assert await late.drain() == await producers[23]
        assert late.received == total
    finally:
        await a.close()
        await b.close()


async def test_stop_edge_stops_the_pump_with_pump_stopped() -> None:
    a, b = await make_pair(FAST)
    try:
        tx_id, rx_id, _rx, producer = await _full_edge(a, b, 8)
        a.driver.handle(StopEdge(8))
        b.driver.handle(StopEdge(8))
        assert await a.wait_for(PumpStopped) == PumpStopped(8, tx_id)
        assert await b.wait_for(PumpStopped) == PumpStopped(8, rx_id)
        b.driver.handle(StopEdge(77))  # never established: answered directly
        assert PumpStopped(77, None) in b.events
        producer.cancel()
    finally:
        await a.close()
        await b.close()


async def test_graceful_stop_of_the_sender_closes_the_receiver_without_a_fault() -> None:
    """Teardown stops the sending edge first (spec §38): its receiver must see a clean
    StreamClosed, not StreamFault(PeerReset), and must not close the ring's producer side
    (a cut object is not EOF: EofMidObject stays reserved for a FIN mid-object)."""
    a, b = await make_pair(FAST)
    try:
        tx_id, rx_id, rx, producer = await _full_edge(a, b, 9)
        a.driver.handle(StopEdge(9))  # the receiver's own StopEdge has not come yet
        assert await a.wait_for(PumpStopped) == PumpStopped(9, tx_id)
        closed = await b.wait_for(StreamClosed)
        assert isinstance(closed, StreamClosed) and closed.edge_id == 9
        assert await b.wait_for(PumpStopped) == PumpStopped(9, rx_id)
        assert not [e for e in b.events if isinstance(e, StreamFault)]
        assert rx.state is RingState.Open
        producer.cancel()
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("first", ["receiver", "sender", "both"])
async def test_graceful_stop_in_any_order_is_no_fault(first: str) -> None:
    """Edge teardown stops both ends (spec §38) in whichever order their StopEdge comes.
    The receiver stopping first sends STOP_SENDING with the stopped code: the sender, its
    stream reset under it mid-transfer, must close cleanly (StreamClosed, PumpStopped),
    not report StreamFault(PeerReset); and the other way round."""
    a, b = await make_pair(FAST)
    try:
        tx_id, rx_id, rx, producer = await _full_edge(a, b, 12)  # mid-transfer
        stopped_first, stopped_second = (b, a) if first == "receiver" else (a, b)
        stopped_first.driver.handle(StopEdge(12))
        if first == "both":
            stopped_second.driver.handle(StopEdge(12))
        other = await stopped_second.wait_for(PumpStopped)
        if first != "both":
            closed = await stopped_second.wait_for(StreamClosed)
            assert isinstance(closed, StreamClosed) and closed.edge_id == 12
        assert other == PumpStopped(12, tx_id if stopped_second is a else rx_id)
        assert await stopped_first.wait_for(PumpStopped) == PumpStopped(
            12, tx_id if stopped_first is a else rx_id)
        await asyncio.sleep(0.2)  # a late reset or STOP_SENDING would show up by now
        assert not [e for e in a.events + b.events if isinstance(e, StreamFault)], (
            a.events, b.events)
        assert rx.state is RingState.Open  # a stop is no EOF for the worker's parser
        producer.cancel()
    finally:
        await a.close()
        await b.close()


def test_digest_helper_is_not_trivial() -> None:
    assert hashlib.sha256(b"".join(payload_chunks(3000, 1, 1000))).hexdigest() != hashlib.sha256(
        b"".join(payload_chunks(3000, 2, 1000))
    ).hexdigest()


async def test_ring_fault_stops_the_recv_pump_with_pump_failed() -> None:
    a, b = await make_pair(FAST)
    try:
        tx_id, rx_id, rx, producer = await _full_edge(a, b, 9)
        # The worker dies: its watcher faults the ring and wakes the pump.
        assert rx.fault(RingFaultReason.WorkerProcessExited)
        b.driver.ring_writable(rx_id)
        fault = await b.wait_for(StreamFault)
        assert isinstance(fault, StreamFault)
        assert (fault.edge_id, fault.reason) == (9, StreamFaultReason.PumpFailed)
        assert await b.wait_for(PumpStopped) == PumpStopped(9, rx_id)
        # the receiver's fault aborts the stream: for the sender that is a fault too
        sent = await a.wait_for(StreamFault)
        assert isinstance(sent, StreamFault)
        assert (sent.edge_id, sent.reason) == (9, StreamFaultReason.PeerReset), sent
        assert await a.wait_for(PumpStopped) == PumpStopped(9, tx_id)
        producer.cancel()
    finally:
        await a.close()
        await b.close()


async def test_second_stream_for_a_live_edge_faults_it() -> None:
    a, b = await make_pair(FAST)
    try:
        rx_id, rx_layout, rx = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(10, a.identity.node_id, rx_id, rx_layout))
        link, first = await _raw_stream(a, b)
        preamble = EdgePreamble(edge_id=EdgeId(10)).pack()
        link.send(first, preamble + b"one")  # type: ignore[attr-defined]
        async with asyncio.timeout(5):
            while rx.commit < 3:
                await asyncio.sleep(0.01)
        second = link.open_uni_stream()  # type: ignore[attr-defined]
        link.send(second, preamble + b"two")  # type: ignore[attr-defined]
        fault = await b.wait_for(StreamFault)
        assert isinstance(fault, StreamFault)
        assert (fault.edge_id, fault.reason) == (10, StreamFaultReason.DuplicateStream)
        assert bytes(rx.readable_span()) == b"one"
    finally:
        await a.close()
        await b.close()


async def test_unreachable_consumer_is_a_handshake_fault() -> None:
    a = await make_node(dataclasses.replace(FAST, handshake_timeout=0.5))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        peer = NodeIdentity.generate().node_id
        a.endpoint.address_book[peer] = ("127.0.0.1", port)
        tx_id, tx_layout, _ = a.new_ring(1 << 16)
        a.driver.handle(EstablishSend(1, peer, tx_id, tx_layout))
        fault = await a.wait_for(StreamFault)
        assert isinstance(fault, StreamFault)
        assert (fault.edge_id, fault.reason) == (1, StreamFaultReason.HandshakeFailed)
        assert await a.wait_for(PumpStopped) == PumpStopped(1, tx_id)
        assert DriverEdgeReady(1) not in a.events
    finally:
        await a.close()


async def test_stopped_edge_gives_its_connection_credit_back() -> None:
    """A stream stopped while holding a full window must return that connection-wide
    credit: otherwise each stopped edge shrinks MAX_DATA for the edges that follow."""
    a, b = await make_pair(FAST)
    try:
        b.driver.expect_recv([(31, a.identity.node_id)])
        tx_id, tx_layout, tx = a.new_ring(1 << 20)
        a.driver.handle(EstablishSend(31, b.identity.node_id, tx_id, tx_layout))
        producer = asyncio.create_task(produce(a, tx, tx_id, payload_chunks(1 << 20, 31)))
        async with asyncio.timeout(10):  # the stream waits unread in pending_streams
            while b.driver.pending_streams.get(31) is None or (
                b.driver.pending_streams[31].buffered < FAST.stream_window - PREAMBLE_LEN
            ):
                await asyncio.sleep(0.01)
        link = b.driver.pending_streams[31].link
        assert link.quic.received_unconsumed() == FAST.stream_window - PREAMBLE_LEN
        b.driver.handle(StopEdge(31))
        async with asyncio.timeout(10):
            while link.quic.received_unconsumed() != 0:
                await asyncio.sleep(0.01)
        producer.cancel()
    finally:
        await a.close()
        await b.close()


async def test_peer_reset_of_an_unread_stream_gives_its_credit_back() -> None:
    a, b = await make_pair(FAST)
    try:
        # provisioned, never established: the stream waits unread
        b.driver.expect_recv([(32, a.identity.node_id)])
        link, sid = await _raw_stream(a, b)
        preamble = EdgePreamble(edge_id=EdgeId(32)).pack()
        link.send(sid, preamble + bytes(100_000))  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            while b.driver.pending_streams.get(32) is None or (
                b.driver.pending_streams[32].buffered < 100_000
            ):
                await asyncio.sleep(0.01)
        b_link = b.driver.pending_streams[32].link
        assert b_link.quic.received_unconsumed() == 100_000
        link.reset_stream(sid)  # type: ignore[attr-defined]
        fault = await b.wait_for(StreamFault)
        assert isinstance(fault, StreamFault) and fault.reason is StreamFaultReason.PeerReset
        assert b_link.quic.received_unconsumed() == 0
    finally:
        await a.close()
        await b.close()


async def test_a_new_plan_forgets_the_ended_edges_of_the_last_one() -> None:
    """Edge ids are drawn per run: a long-lived node must not keep every finished binding
    (its link, ring handle and ended pump task). The next plan drops them; a late stream
    for a forgotten edge is still refused as DuplicateStream, not adopted."""
    a, b = await make_pair(FAST)
    try:
        await _transfer(a, b, 5, 1 << 20, recv_first=True)
        assert await a.wait_for(PumpStopped) == PumpStopped(5, 1)
        async with asyncio.timeout(5):
            while not (b.driver.recv_edges[5].task and b.driver.recv_edges[5].task.done()):
                await asyncio.sleep(0.01)
            while not all(t.done() for t in a.driver.send_edges[5].tasks):
                await asyncio.sleep(0.01)
        recv_ref = weakref.ref(b.driver.recv_edges[5])
        send_ref = weakref.ref(a.driver.send_edges[5])
        b.driver.expect_recv([(6, a.identity.node_id)])  # the next run's plan
        rx_id, rx_layout, _ = a.new_ring(1 << 16)
        # the next run's establish
        a.driver.handle(EstablishRecv(7, b.identity.node_id, rx_id, rx_layout))
        gc.collect()
        assert 5 not in b.driver.recv_edges and 5 not in a.driver.send_edges
        assert recv_ref() is None, gc.get_referrers(recv_ref())
        assert send_ref() is None, gc.get_referrers(send_ref())
        before = len(b.of_type(StreamRefused))
        link, late = await _raw_stream(a, b)
        link.send(late, EdgePreamble(edge_id=EdgeId(5)).pack() + b"late")  # type: ignore[attr-defined]
        async with asyncio.timeout(5):
            while len(b.of_type(StreamRefused)) == before:
                await asyncio.sleep(0.01)
        fault = b.of_type(StreamRefused)[-1]
        assert (fault.edge_id, fault.reason) == (5, StreamFaultReason.DuplicateStream)
        with pytest.raises(TransportError, match="already established"):
            b.driver.handle(EstablishRecv(5, a.identity.node_id, *b.new_ring(1 << 16)[:2]))
    finally:
        await a.close()
        await b.close()
