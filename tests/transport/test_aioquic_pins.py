"""Fails loudly when an aioquic upgrade removes a private name the transport relies on."""

from __future__ import annotations

import math
from importlib.metadata import version

from aioquic.quic.connection import Limit, QuicConnection
from aioquic.quic.recovery import QuicPacketPacer

from swactor.transport.config import TransportConfig
from swactor.transport.flow import (
    PACING_GAIN,
    SwactorConnection,
    TickPacer,
    check_private_names,
)
from swactor.transport.identity import NodeIdentity


def test_tested_aioquic_range() -> None:
    major, minor = (int(part) for part in version("aioquic").split(".")[:2])
    assert (1, 7) <= (major, minor) < (1, 8), "flow.py private names are tested on 1.7 only"


def test_private_names_exist() -> None:
    assert check_private_names() == []


def test_connection_instance_attributes_exist() -> None:
    config = TransportConfig().quic_configuration(NodeIdentity.generate(), is_client=True)
    conn = SwactorConnection(configuration=config, stream_window=1 << 16, connection_window=1 << 20)
    assert isinstance(conn._local_max_data, Limit)
    for limit in (conn._local_max_data, conn._local_max_streams_uni, conn._local_max_streams_bidi):
        assert {"used", "value", "sent", "frame_type"} <= set(vars(limit))
    assert isinstance(conn._streams, dict)
    assert conn._is_client is True
    assert conn._max_datagram_size == TransportConfig().max_datagram_size
    assert conn._local_max_data.value == TransportConfig().connection_window
    assert conn._ack_delay == 0.0  # overrides aioquic's K_GRANULARITY (attribute must exist)
    assert "_ack_delay" in vars(QuicConnection(configuration=config))


def test_pacer_is_replaceable() -> None:
    config = TransportConfig().quic_configuration(NodeIdentity.generate(), is_client=True)
    paced = SwactorConnection(
        configuration=config, stream_window=1 << 16, connection_window=1 << 20
    )
    assert isinstance(paced._loss._pacer, QuicPacketPacer)
    unpaced = SwactorConnection(
        configuration=config, stream_window=1 << 16, connection_window=1 << 20, pacing=False
    )
    for conn in (paced, unpaced):  # a burst of 100 packets at one instant
        conn._loss._pacer.update_rate(congestion_window=20000, smoothed_rtt=0.01)
        for _ in range(100):
            conn._loss._pacer.update_after_send(now=1.0)
    assert unpaced._loss._pacer.next_send_time(now=1.0) is None
    assert paced._loss._pacer.next_send_time(now=1.0) is not None


def _packets_in(pacer: QuicPacketPacer, seconds: float) -> int:
    """Datagrams a pacer lets out in `seconds` when every wait it asks for is rounded up
    to a whole millisecond, as asyncio's epoll selector does with timeouts."""
    now, sent = 1.0, 0
    end = now + seconds
    while now < end:
        wait_until = pacer.next_send_time(now=now)
        if wait_until is None:
            pacer.update_after_send(now=now)
            sent += 1
        else:
            now += math.ceil((wait_until - now) * 1e3) * 1e-3
    return sent


def test_tick_pacer_keeps_the_rate_with_millisecond_timers() -> None:
    datagram, cwnd, srtt = 1452, 1 << 20, 0.004  # 262 MB/s, ~180 datagrams per ms
    rate_packets = cwnd / srtt / datagram  # aioquic's pacing rate; TickPacer's is 1.25x
    stock = QuicPacketPacer(max_datagram_size=datagram)
    tick = TickPacer(max_datagram_size=datagram)
    for pacer in (stock, tick):
        pacer.update_rate(congestion_window=cwnd, smoothed_rtt=srtt)
    # aioquic's burst of 16 then a sub-millisecond timer: 16 per ms, a tenth of the rate.
    assert _packets_in(stock, 0.1) < 0.2 * rate_packets * 0.1
    paced = PACING_GAIN * rate_packets * 0.1
    assert 0.9 * paced < _packets_in(tick, 0.1) < 1.1 * paced + 256
