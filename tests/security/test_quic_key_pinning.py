"""QUIC key pinning: where an endpoint pins a node id's full public key (a pool file), a
peer whose certificate carries another key is refused, inbound and outbound, even when
that key's 64-bit node id is the pinned id; the victim keeps serving its real peers.

Real aioquic endpoints on loopback. Grinding a 64-bit id collision is out of reach, so
the collision is made: `node_id_from_certificate` is patched so that the impostor's key
hashes to the real peer's id (every other key keeps its real id). Without the pin the
impostor is admitted (`test_without_a_pin_the_collision_is_admitted` shows the patch
does collide); with it, only the key that was pinned gets a link.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from cryptography import x509

from swactor.membership.admission import Admission, PoolEntry, public_key_bytes
from swactor.testing.memory_net import MemoryNetwork
from swactor.transport import endpoint as endpoint_module
from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import PeerRefused, QuicEndpoint, QuicLink
from swactor.transport.errors import ConnectionLostError, PeerRejectedError
from swactor.transport.factory import QuicTransport
from swactor.transport.identity import (
    NodeIdentity,
    node_id_from_certificate,
    raw_public_key_from_certificate,
)
from tests.transport.ack_rig import QuietLinkHandler

pytestmark = pytest.mark.timeout(60)
CONFIG = TransportConfig(max_datagram_size=1452, handshake_timeout=5.0)


class Collector(QuietLinkHandler):
    """A LinkHandler that records the stream bytes of verified links, by peer id."""

    def __init__(self) -> None:
        self.data: dict[int, bytearray] = {}

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        assert link.peer_node_id is not None
        self.data.setdefault(link.peer_node_id, bytearray()).extend(data)


def _mismatch(node_id: int) -> str:
    return f"node {node_id:#018x} presented a key that does not match its pinned key"


async def _endpoint(identity: NodeIdentity, allowed: tuple[int, ...] = (),
                    pinned: dict[int, bytes] | None = None) -> tuple[QuicEndpoint, Collector]:
    endpoint = QuicEndpoint(identity, CONFIG, allowed=allowed, pinned=pinned)
    collector = Collector()
    endpoint.register_handler(EDGE_ALPN, collector)
    await endpoint.start()
    return endpoint, collector


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


async def _send(client: QuicEndpoint, server: QuicEndpoint, server_id: int,
                payload: bytes) -> QuicLink:
    """Connect `client` to `server` (as `server_id`) and send `payload` on a stream."""
    link = await client.connect(server_id, EDGE_ALPN, server.address)
    stream = link.open_uni_stream()
    link.send(stream, payload, end=True)
    return link


async def _refused_dial(client: QuicEndpoint, server: QuicEndpoint) -> str:
    """`client` dials `server` and tries to send; the server refuses the handshake. The
    refusal may close the link before or after `connect` returns (one datagram batch):
    returns the reason the client's link was closed with, either way."""
    try:
        link = await _send(client, server, server.node_id, b"forged" * 100)
    except ConnectionLostError as error:
        return str(error)
    await _until(lambda: link.closed)
    return link.close_reason


async def _serves(victim: QuicEndpoint, victim_rx: Collector, honest: QuicEndpoint,
                  honest_rx: Collector) -> None:
    """The victim still reaches a pinned peer and takes its bytes: one handshake the
    victim opens (its outbound check), then one the peer opens (its inbound check)."""
    out = await _send(victim, honest, honest.node_id, b"honest-out")
    await _until(lambda: bytes(honest_rx.data.get(victim.node_id, b"")) == b"honest-out")
    out.close("done")
    await _until(lambda: (cached := honest.cached(victim.node_id, EDGE_ALPN)) is None
                 or cached.closed)
    await _send(honest, victim, victim.node_id, b"honest-in")
    await _until(lambda: bytes(victim_rx.data.get(honest.node_id, b"")) == b"honest-in")


def _key(identity: NodeIdentity) -> bytes:
    return public_key_bytes(identity)


@pytest.fixture
def collide(monkeypatch: pytest.MonkeyPatch) -> dict[bytes, int]:
    """Keys listed here derive the given node id in the endpoint's check (a made-up
    64-bit collision); every other key keeps its real id."""
    table: dict[bytes, int] = {}

    def patched(certificate: x509.Certificate) -> int:
        forced = table.get(raw_public_key_from_certificate(certificate))
        return forced if forced is not None else node_id_from_certificate(certificate)

    monkeypatch.setattr(endpoint_module, "node_id_from_certificate", patched)
    return table


async def test_without_a_pin_the_collision_is_admitted(collide: dict[bytes, int]) -> None:
    real, impostor, victim_id = (NodeIdentity.generate() for _ in range(3))
    collide[_key(impostor)] = real.node_id
    victim, victim_rx = await _endpoint(victim_id, allowed=(real.node_id,))
    mallory, _ = await _endpoint(impostor, allowed=(victim_id.node_id,))
    try:
        await _send(mallory, victim, victim.node_id, b"forged")
        await _until(lambda: bytes(victim_rx.data.get(real.node_id, b"")) == b"forged")
        assert not victim.refused
    finally:
        await mallory.close()
        await victim.close()


async def test_colliding_key_is_refused_inbound_and_outbound(
        collide: dict[bytes, int]) -> None:
    real, impostor, victim_id = (NodeIdentity.generate() for _ in range(3))
    collide[_key(impostor)] = real.node_id
    pins = {real.node_id: _key(real), victim_id.node_id: _key(victim_id)}
    victim, victim_rx = await _endpoint(victim_id, allowed=(real.node_id,), pinned=pins)
    mallory, mallory_rx = await _endpoint(impostor, allowed=(victim_id.node_id,))
    honest, honest_rx = await _endpoint(real, allowed=(victim_id.node_id,), pinned=pins)
    try:
        # inbound: the impostor dials the victim as the pinned id
        assert _mismatch(real.node_id) in await _refused_dial(mallory, victim)
        assert list(victim.refused) == [PeerRefused(real.node_id, _mismatch(real.node_id),
                                                    inbound=True)]
        # outbound: the victim dials the impostor's address believing it is the real peer
        with pytest.raises(PeerRejectedError, match="does not match its pinned key"):
            await victim.connect(real.node_id, EDGE_ALPN, mallory.address)
        assert list(victim.refused)[-1] == PeerRefused(
            real.node_id, _mismatch(real.node_id), inbound=False)
        assert victim.cached(real.node_id, EDGE_ALPN) is None
        assert victim.admission["peer_refused"] == 2
        await _serves(victim, victim_rx, honest, honest_rx)
        assert b"forged" not in bytes(victim_rx.data.get(real.node_id, b""))
        assert not mallory_rx.data
    finally:
        for endpoint in (honest, mallory, victim):
            await endpoint.close()


async def test_real_peer_with_a_wrong_pin_is_refused_both_ways() -> None:
    """A pinned key that a peer's certificate does not carry refuses that real peer."""
    peer_id, victim_id = NodeIdentity.generate(), NodeIdentity.generate()
    wrong = _key(NodeIdentity.generate())
    victim, victim_rx = await _endpoint(victim_id, allowed=(peer_id.node_id,),
                                        pinned={peer_id.node_id: wrong})
    peer, _ = await _endpoint(peer_id, allowed=(victim_id.node_id,))
    try:
        assert _mismatch(peer_id.node_id) in await _refused_dial(peer, victim)
        with pytest.raises(PeerRejectedError, match="does not match its pinned key"):
            await victim.connect(peer_id.node_id, EDGE_ALPN, peer.address)
        assert [r.inbound for r in victim.refused] == [True, False]
        assert not victim_rx.data
    finally:
        await peer.close()
        await victim.close()


async def test_repinning_closes_a_link_whose_key_no_longer_matches() -> None:
    a_id, b_id = NodeIdentity.generate(), NodeIdentity.generate()
    a, _ = await _endpoint(a_id, allowed=(b_id.node_id,), pinned={b_id.node_id: _key(b_id)})
    b, _ = await _endpoint(b_id, allowed=(a_id.node_id,), pinned={a_id.node_id: _key(a_id)})
    try:
        link = await a.connect(b_id.node_id, EDGE_ALPN, b.address)
        assert link.peer_public_key == _key(b_id) and not link.closed
        a.pin_keys({b_id.node_id: _key(b_id)})  # same pin: the link stays
        assert not link.closed
        a.pin_keys({b_id.node_id: _key(NodeIdentity.generate())})
        assert link.closed and "no longer matches its pinned key" in link.close_reason
        with pytest.raises(ValueError, match="not a raw 32-byte"):
            a.pin_keys({b_id.node_id: b"short"})
    finally:
        await a.close()
        await b.close()


def test_pool_file_keys_reach_the_endpoint() -> None:
    """The pool's members are what `Transport.endpoint` pins (node and orchestrator
    build their endpoints this way from `--pool`)."""
    orch, node = NodeIdentity.generate(), NodeIdentity.generate()
    admission = Admission.of([PoolEntry("orchestrator", _key(orch)),
                              PoolEntry("node", _key(node))])
    assert admission.pinned_keys == {orch.node_id: _key(orch), node.node_id: _key(node)}
    endpoint = QuicTransport().endpoint(orch, CONFIG, {node.node_id},
                                        admission.pinned_keys)
    assert endpoint.pinned == admission.pinned_keys


def test_memory_network_applies_the_same_pins() -> None:
    """The in-process stand-in refuses a peer whose key does not match a pin, as the
    real endpoint's handshake does."""
    net = MemoryNetwork()
    a_id, b_id = NodeIdentity.generate(), NodeIdentity.generate()
    a = net.endpoint(a_id, CONFIG, {b_id.node_id}, {b_id.node_id: _key(b_id)})
    b = net.endpoint(b_id, CONFIG, {a_id.node_id}, {a_id.node_id: _key(a_id)})
    assert b.admits(a) and a.admits(b)
    a.pin_keys({b_id.node_id: _key(NodeIdentity.generate())})
    assert not a.admits(b) and b.admits(a)
