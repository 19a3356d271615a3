"""Backpressure proof (spec §35): a consumer stalls longer than the idle timeout, then drains.

While it stalls, the receiver holds at most one stream window outside its ring, the
sender's unacknowledged buffer stays below its high-water mark, the sender stops at
"consumed + ring + window", keep-alives keep the connection, and afterwards every byte
arrives with a matching digest.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from swactor.transport.config import TransportConfig
from swactor.transport.messages import EstablishRecv, EstablishSend, StreamClosed, StreamFault
from swactor.transport.udp import Datagram
from tests.transport.harness import (
    Consumer,
    Node,
    fail_on_fault,
    make_pair,
    payload_chunks,
    produce,
)

RING = 1 << 20


@dataclass
class Peaks:
    receiver_held: int = 0
    sender_buffered: int = 0
    sender_ahead: int = 0
    samples: int = 0
    progress_during_stall: int = -1


async def _watch(a: Node, b: Node, edge: int, consumer: Consumer, peaks: Peaks) -> None:
    while True:
        send = a.driver.send_edges.get(edge)
        recv = b.driver.recv_edges.get(edge)
        if send is not None and send.link is not None and send.stream_id is not None:
            peaks.sender_buffered = max(
                peaks.sender_buffered, send.link.quic.send_buffered(send.stream_id)
            )
            peaks.sender_ahead = max(peaks.sender_ahead, send.offset - consumer.received)
        if recv is not None and recv.inbound is not None:
            peaks.receiver_held = max(
                peaks.receiver_held, recv.inbound.link.quic.received_unconsumed()
            )
        peaks.samples += 1
        await asyncio.sleep(0.005)


async def _proof(config: TransportConfig, total: int, stall_s: float) -> None:
    a, b = await make_pair(config)
    try:
        tx_id, tx_layout, tx = a.new_ring(RING)
        rx_id, rx_layout, rx = b.new_ring(RING)
        b.driver.handle(EstablishRecv(1, a.identity.node_id, rx_id, rx_layout))
        a.driver.handle(EstablishSend(1, b.identity.node_id, tx_id, tx_layout))
        consumer = Consumer(b, rx, rx_id)
        peaks = Peaks()
        watcher = asyncio.create_task(_watch(a, b, 1, consumer, peaks))
        stall_at = total // 8

        async def sender_offset_during_stall() -> None:
            while consumer.received < stall_at:
                await asyncio.sleep(0.01)
            await asyncio.sleep(stall_s / 2)
            send = a.driver.send_edges[1]
            before = send.offset
            await asyncio.sleep(stall_s / 3)
            peaks.progress_during_stall = send.offset - before

        probe = asyncio.create_task(sender_offset_during_stall())
        sent, got = await fail_on_fault(
            (a, b),
            asyncio.gather(
                produce(a, tx, tx_id, payload_chunks(total, seed=1)),
                consumer.drain(stall_s=stall_s, stall_after=stall_at),
            ),
            timeout=stall_s + total / (256 << 10) + 10,  # 256 KiB/s floor
        )
        await probe
        watcher.cancel()
        assert got == sent and consumer.received == total
        assert await b.wait_for(StreamClosed) == StreamClosed(1, total)
        assert not a.of_type(StreamFault) and not b.of_type(StreamFault)
        link = a.driver.send_edges[1].link
        assert link is not None and not link.closed, "connection died during the stall"
        assert peaks.samples > 50
        # Receiver memory: ring (bounded by construction) + at most one stream window.
        assert 0 < peaks.receiver_held <= config.stream_window
        assert consumer.high_fill == RING  # the ring really filled up
        # Sender: unacknowledged bytes below the high-water mark.
        assert 0 < peaks.sender_buffered <= config.send_high_water
        # The sender stalled: it got at most ring + window + high-water ahead of the
        # consumer, and sent nothing while the consumer was stalled.
        assert peaks.sender_ahead <= RING + config.stream_window + config.send_high_water
        assert peaks.progress_during_stall == 0
    finally:
        await a.close()
        await b.close()


def _config(max_datagram_size: int) -> TransportConfig:
    return TransportConfig(
        max_datagram_size=max_datagram_size,
        stream_window=256 << 10,
        edges_per_connection=4,
        connection_window=1 << 20,
        send_high_water=256 << 10,
        idle_timeout=1.0,
        keepalive_interval=0.25,
    )


@pytest.mark.timeout(120)
async def test_backpressure_64mib_stall_longer_than_idle_timeout() -> None:
    await _proof(_config(16383), 64 << 20, stall_s=1.6)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_backpressure_256mib_at_1452_byte_datagrams() -> None:
    await _proof(_config(1452), 256 << 20, stall_s=1.6)


@dataclass
class EveryTenthLost:
    """A lossy path that drops every tenth datagram it is given, counting both."""

    seen: int = 0
    dropped: int = 0

    def __call__(self, datagrams: list[Datagram]) -> list[Datagram]:
        kept = []
        for datagram in datagrams:
            self.seen += 1
            if self.seen % 10 == 0:
                self.dropped += 1
            else:
                kept.append(datagram)
        return kept


@pytest.mark.timeout(180)
async def test_lossy_path_loses_no_byte_and_no_credit() -> None:
    """Every tenth datagram dropped, both ways, once the link is up: lost STREAM data,
    ACKs and credit updates (MAX_STREAM_DATA / MAX_DATA, re-sent by the flow-control
    override) all recover."""
    max_datagram = 1452
    config = TransportConfig(
        max_datagram_size=max_datagram,
        stream_window=64 << 10,
        edges_per_connection=2,
        connection_window=128 << 10,
        send_high_water=64 << 10,
        idle_timeout=20.0,
        keepalive_interval=1.0,
    )
    path = EveryTenthLost()
    lossy = False

    def outbound(datagrams: list[Datagram]) -> list[Datagram]:
        return path(datagrams) if lossy else datagrams

    a, b = await make_pair(config, outbound)
    try:
        total = 2 << 20
        tx_id, tx_layout, tx = a.new_ring(256 << 10)
        rx_id, rx_layout, rx = b.new_ring(256 << 10)
        lossy = True
        b.driver.handle(EstablishRecv(1, a.identity.node_id, rx_id, rx_layout))
        a.driver.handle(EstablishSend(1, b.identity.node_id, tx_id, tx_layout))
        consumer = Consumer(b, rx, rx_id)
        sent, got = await fail_on_fault(
            (a, b),
            asyncio.gather(produce(a, tx, tx_id, payload_chunks(total, 3)), consumer.drain()),
            timeout=150,
        )
        assert got == sent and consumer.received == total
        # The path really was lossy: every payload byte crossed it in datagrams of at
        # most `max_datagram` bytes, and it dropped one in ten of whatever it was given.
        assert path.seen >= total // max_datagram
        assert path.dropped == path.seen // 10
    finally:
        await a.close()
        await b.close()
