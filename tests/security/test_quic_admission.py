"""QUIC half-open exhaustion (an adversary that sends Initials): every one ends in a
Retry or a drop, the victim builds no connection for an unproven source, half-open
connections are capped per host and expire, and the victim keeps serving its peers.

The adversary is built from aioquic's own client (real Initials, real Retry handling)
on its own UDP sockets; the victim is a real `QuicEndpoint`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket

import pytest
from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from swactor.transport.config import ALPNS, EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import REFUSALS_KEPT, PeerRefused
from swactor.transport.errors import TransportError
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import DriverEdgeReady, EstablishRecv, EstablishSend
from swactor.transport.retry import RetryTokenError, RetryTokens
from swactor.transport.udp import DatagramRun, UdpSocket
from tests.transport.harness import Node, make_node, make_pair, produce

pytestmark = pytest.mark.timeout(120)
CONFIG = TransportConfig(max_datagram_size=1452, handshake_timeout=1.0,
                         max_half_open=8, max_half_open_per_host=3)


def _initial(dcid: bytes | None = None) -> bytes:
    """One client Initial (1200 bytes, no token) as aioquic builds it; `dcid` replaces
    its destination connection id (same length: the header stays valid)."""
    config = QuicConfiguration(is_client=True, alpn_protocols=list(ALPNS))
    client = QuicConnection(configuration=config)
    client.connect(("127.0.0.1", 9), now=0.0)
    data = client.datagrams_to_send(now=0.0)[0][0]
    assert len(data) >= 1200 and data[5] == 8
    if dcid is not None:
        data = data[:6] + dcid + data[14:]
    return data


class _Adversary:
    """aioquic clients on their own sockets that complete the Retry round trip and then
    go silent in the middle of the handshake (a half-open connection each)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.socks: list[socket.socket] = []

    def half_open(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(2.0)
        self.socks.append(sock)
        ident = NodeIdentity.generate()
        config = QuicConfiguration(is_client=True, alpn_protocols=[EDGE_ALPN])
        config.certificate, config.private_key = ident.certificate, ident.private_key
        client = QuicConnection(configuration=config)
        client.connect(self.target, now=0.0)
        for data, addr in client.datagrams_to_send(now=0.0):
            sock.sendto(data, addr)
        retry, _ = sock.recvfrom(65536)
        header = pull_quic_header(Buffer(data=retry), host_cid_length=8)
        assert header.packet_type == QuicPacketType.RETRY
        client.receive_datagram(retry, self.target, now=0.0)
        for data, addr in client.datagrams_to_send(now=0.0):  # the Initial with the token
            sock.sendto(data, addr)
        return sock

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def test_retry_tokens_are_bound_to_address_ids_and_age() -> None:
    tokens = RetryTokens(lifetime=5.0)
    odcid, rscid = os.urandom(8), os.urandom(8)
    token = tokens.issue(("127.0.0.1", 4000), odcid, rscid, now=100.0)
    proof = tokens.check(("127.0.0.1", 4000), token, now=101.0)
    assert (proof.original_destination_cid, proof.retry_source_cid) == (odcid, rscid)
    for addr, tok, now in (
        (("127.0.0.1", 4001), token, 101.0),  # another port
        (("127.0.0.2", 4000), token, 101.0),  # another host
        (("127.0.0.1", 4000), token, 106.0),  # too old
        (("127.0.0.1", 4000), token[:-1] + bytes([token[-1] ^ 1]), 101.0),  # forged tag
        (("127.0.0.1", 4000), token[:10], 101.0),  # truncated
        (("127.0.0.1", 4000), b"\x07" + token[1:], 101.0),  # unknown version
    ):
        with pytest.raises(RetryTokenError):
            tokens.check(addr, tok, now)
    with pytest.raises(RetryTokenError):  # another endpoint's key
        RetryTokens(lifetime=5.0).check(("127.0.0.1", 4000), token, now=101.0)


async def test_initial_flood_gets_retries_and_builds_nothing() -> None:
    """1,000 Initials with fresh connection ids: each is answered by one Retry smaller
    than itself, no connection exists afterwards, and an edge keeps moving bytes."""
    a, b = await make_pair(CONFIG)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        rx_id, rx_layout, ring = b.new_ring(1 << 16)
        b.driver.handle(EstablishRecv(1, a.identity.node_id, rx_id, rx_layout))
        tx_id, tx_layout, tx = a.new_ring(1 << 16)
        a.driver.handle(EstablishSend(1, b.identity.node_id, tx_id, tx_layout))
        await a.wait_for(DriverEdgeReady)  # a's link to b is up before the flood
        links_before = len(b.endpoint._links)
        before = dict(b.endpoint.admission)
        template = _initial()
        replies: list[int] = []
        for i in range(1000):
            sock.sendto(template[:6] + os.urandom(8) + template[14:], b.endpoint.address)
            if i % 50 == 49:
                await asyncio.sleep(0.005)  # let the victim's loop read
                replies += _drain(sock)
        async with asyncio.timeout(20):  # the victim answers at its own pace
            while len(replies) < 1000:
                await asyncio.sleep(0.02)
                replies += _drain(sock)
        await asyncio.sleep(0.1)
        replies += _drain(sock)
        assert b.endpoint.admission["retry_sent"] - before["retry_sent"] == 1000 == len(replies)
        assert max(replies) < len(template)  # no amplification
        assert b.endpoint.half_open == 0 and len(b.endpoint._links) == links_before
        assert b.endpoint.admission["accepted"] == before["accepted"]
        # the victim still serves: the edge moves its bytes
        await produce(a, tx, tx_id, [b"payload" * 2000], close=True)
        while ring.commit < 14000:
            await asyncio.sleep(0.01)
        assert bytes(ring.readable_span()) == b"payload" * 2000
    finally:
        sock.close()
        await a.close()
        await b.close()


def _drain(sock: socket.socket) -> list[int]:
    sizes = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return sizes
        header = pull_quic_header(Buffer(data=data), host_cid_length=8)
        assert header.packet_type == QuicPacketType.RETRY
        sizes.append(len(data))


async def test_forged_and_foreign_tokens_are_dropped() -> None:
    b = await make_node(CONFIG)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.3)
    try:
        other = RetryTokens(lifetime=5.0)  # not the victim's key
        config = QuicConfiguration(is_client=True, alpn_protocols=list(ALPNS))
        config.token = other.issue(sock.getsockname(), os.urandom(8), os.urandom(8), 0.0)
        client = QuicConnection(configuration=config)
        client.connect(b.endpoint.address, now=0.0)
        for data, addr in client.datagrams_to_send(now=0.0):
            sock.sendto(data, addr)
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(sock.recv, 65536)  # no answer at all
        assert b.endpoint.admission["bad_token"] == 1
        assert b.endpoint.half_open == 0 and not b.endpoint._links
    finally:
        sock.close()
        await b.close()


async def _settled(victim: Node, attempts: int) -> None:
    """Wait until the victim has judged `attempts` token-bearing Initials."""
    judged = ("accepted", "host_full", "half_open_full")
    async with asyncio.timeout(20):
        while sum(victim.endpoint.admission[k] for k in judged) < attempts:
            await asyncio.sleep(0.02)


async def test_half_open_connections_are_capped_per_host_and_expire() -> None:
    b = await make_node(CONFIG)
    adversary = _Adversary(b.endpoint.address)
    try:
        for _ in range(CONFIG.max_half_open_per_host + 4):
            await asyncio.to_thread(adversary.half_open)
        await _settled(b, CONFIG.max_half_open_per_host + 4)
        assert b.endpoint.half_open == CONFIG.max_half_open_per_host
        assert b.endpoint.admission["host_full"] == 4
        async with asyncio.timeout(20):  # each expires handshake_timeout after it began
            while b.endpoint.half_open or b.endpoint._links:
                await asyncio.sleep(0.05)
        assert b.endpoint.admission["handshake_expired"] == CONFIG.max_half_open_per_host
        # the victim then admits a real peer from the same host
        a = await make_node(CONFIG)
        b.endpoint.allowed.add(a.identity.node_id)
        try:
            link = await a.endpoint.connect(b.identity.node_id, EDGE_ALPN, b.endpoint.address)
            assert link.peer_node_id == b.identity.node_id
        finally:
            await a.close()
    finally:
        adversary.close()
        await b.close()


async def test_half_open_connections_are_capped_in_all() -> None:
    config = dataclasses.replace(CONFIG, max_half_open=4, max_half_open_per_host=16)
    b = await make_node(config)
    adversary = _Adversary(b.endpoint.address)
    try:
        for _ in range(7):
            await asyncio.to_thread(adversary.half_open)
        await _settled(b, 7)
        assert b.endpoint.half_open == 4
        assert b.endpoint.admission["half_open_full"] == 3
    finally:
        adversary.close()
        await b.close()


async def test_identity_refusals_are_kept_bounded() -> None:
    b = await make_node(CONFIG)  # allows nobody
    try:
        for _ in range(REFUSALS_KEPT + 5):
            b.endpoint.report_refused(PeerRefused(1, "not in the allow-list", True))
        assert len(b.endpoint.refused) == REFUSALS_KEPT
        assert b.endpoint.admission["peer_refused"] == REFUSALS_KEPT + 5
    finally:
        await b.close()


async def test_host_names_are_resolved_or_refused_cleanly() -> None:
    a, b = await make_pair(CONFIG)
    try:
        port = b.endpoint.address[1]
        a.endpoint.address_book[b.identity.node_id] = ("localhost", port)
        link = await a.endpoint.connect(b.identity.node_id, EDGE_ALPN)
        assert link.addr == ("127.0.0.1", port)

        unknown = NodeIdentity.generate().node_id
        for bad in (("::1", port), ("127.0.0.1", 0)):
            with pytest.raises(TransportError, match="peer address"):
                await a.endpoint.connect(unknown, EDGE_ALPN, bad)
    finally:
        await a.close()
        await b.close()


def test_a_host_name_in_a_datagram_run_is_dropped_not_raised() -> None:
    """The GSO send path packs numeric addresses only: a name reaching it (the endpoint
    resolves names before) loses those datagrams, as any send error does."""
    rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_sock.bind(("127.0.0.1", 0))
    tx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx_sock.bind(("127.0.0.1", 0))
    try:
        tx = UdpSocket(tx_sock)
        run = DatagramRun(memoryview(bytearray(1452 * 3)), 1452, 3)
        tx.send([(run, ("localhost", rx_sock.getsockname()[1]))])  # no exception
        tx.send([(run, rx_sock.getsockname())])
        rx_sock.settimeout(2.0)
        assert len(rx_sock.recv(65536)) in (1452, 1452 * 3)
    finally:
        rx_sock.close()
        tx_sock.close()
