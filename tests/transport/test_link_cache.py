"""The endpoint's link cache: a peer that comes back from a new endpoint is reached there.

An orchestrator's next session has a new endpoint with the same identity; the node may
still hold the previous session's link, open for a moment longer. Requests from the node
(its StageReady) must go on the new link, or they are lost when the old one closes.

A link whose peer closed it (CONNECTION_CLOSE) is closed at once, not when aioquic's
draining period ends: the node's token-out edge to the orchestrator's next session must
not be opened on the past session's draining link (its stream would go nowhere and the
run fault with ConnectionLost once the draining period ends).
"""

from __future__ import annotations

import asyncio

import pytest
from aioquic.quic.connection import QuicConnectionState

from swactor.transport.config import CONTROL_ALPN, EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.identity import NodeIdentity

pytestmark = pytest.mark.timeout(60)
CONFIG = TransportConfig(max_datagram_size=16383)


async def _admitted(node: QuicEndpoint, peer: int, other_than: QuicLink | None) -> QuicLink:
    async with asyncio.timeout(10):
        while True:
            link = node.cached(peer, CONTROL_ALPN)
            if link is not None and link is not other_than:
                return link
            await asyncio.sleep(0.01)


async def test_a_peer_back_from_a_new_endpoint_is_reached_on_its_newest_link() -> None:
    orchestrator, node_identity = NodeIdentity.generate(), NodeIdentity.generate()
    node = QuicEndpoint(node_identity, CONFIG, allowed={orchestrator.node_id})
    await node.start()
    first = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    second = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    try:
        await first.start()
        await first.connect(node_identity.node_id, CONTROL_ALPN, node.address)
        old = await _admitted(node, orchestrator.node_id, None)
        assert old.addr[1] == first.address[1]

        await second.start()  # the next session; the first endpoint is still open
        await second.connect(node_identity.node_id, CONTROL_ALPN, node.address)
        new = await _admitted(node, orchestrator.node_id, old)
        assert new.addr[1] == second.address[1]
        assert not old.closed, "the older link stays open for what it carries"
        reached = await node.connect(orchestrator.node_id, CONTROL_ALPN)
        assert reached is new
    finally:
        for endpoint in (first, second, node):
            await endpoint.close()


async def test_a_link_the_peer_closed_is_not_handed_out_while_it_drains() -> None:
    orchestrator, node_identity = NodeIdentity.generate(), NodeIdentity.generate()
    node = QuicEndpoint(node_identity, CONFIG, allowed={orchestrator.node_id})
    await node.start()
    first = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    second = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    try:
        await first.start()
        old = await node.connect(orchestrator.node_id, EDGE_ALPN, first.address)
        await first.close()  # the session ends: CONNECTION_CLOSE to the node
        async with asyncio.timeout(10):
            while old.quic._state is QuicConnectionState.CONNECTED:
                await asyncio.sleep(0.001)
        # the close arrived; aioquic drains for three probe timeouts before it says so
        assert old.closed, old.quic._state
        assert node.cached(orchestrator.node_id, EDGE_ALPN) in (old, None)

        await second.start()  # the next session
        new = await node.connect(orchestrator.node_id, EDGE_ALPN, second.address)
        assert new is not old and not new.closed
        assert new.addr[1] == second.address[1]
    finally:
        for endpoint in (first, second, node):
            await endpoint.close()


async def test_a_handshake_to_a_gone_address_is_not_joined_once_the_peer_moved() -> None:
    """A node starts a fetch towards the orchestrator just before that session dies (its
    handshake now waits out `handshake_timeout` towards a dead port); the next session,
    same key, new port, is in the address book: a new request dials it at once rather
    than joining the doomed handshake."""
    orchestrator, node_identity = NodeIdentity.generate(), NodeIdentity.generate()
    node = QuicEndpoint(node_identity, CONFIG, allowed={orchestrator.node_id})
    await node.start()
    gone = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    second = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    try:
        await gone.start()
        dead = gone.address
        await gone.close()  # nothing answers at `dead` any more
        node.address_book[orchestrator.node_id] = dead
        doomed = asyncio.ensure_future(node.connect(orchestrator.node_id, EDGE_ALPN))
        await asyncio.sleep(0.05)
        assert not doomed.done()

        await second.start()
        node.address_book[orchestrator.node_id] = second.address
        async with asyncio.timeout(CONFIG.handshake_timeout / 2):
            link = await node.connect(orchestrator.node_id, EDGE_ALPN)
        assert link.addr == second.address and not link.closed
        doomed.cancel()
    finally:
        for endpoint in (second, node):
            await endpoint.close()


async def test_status_tells_a_closing_link_from_an_open_one_until_it_is_forgotten() -> None:
    """The leak check (`QuicEndpoint.status`): a link is counted under its peer while
    open, under `closing` from the peer's CONNECTION_CLOSE on, and not at all once its
    draining period ends."""
    orchestrator, node_identity = NodeIdentity.generate(), NodeIdentity.generate()
    node = QuicEndpoint(node_identity, CONFIG, allowed={orchestrator.node_id})
    await node.start()
    session = QuicEndpoint(orchestrator, CONFIG, allowed={node_identity.node_id})
    try:
        await session.start()
        link = await node.connect(orchestrator.node_id, EDGE_ALPN, session.address)
        peer = f"{orchestrator.node_id:016x}"
        status = node.status()
        assert (status["links"], status["closing"], status["peers"]) == (1, 0, {peer: 1})

        await session.close()
        async with asyncio.timeout(10):
            while not link.closed:
                await asyncio.sleep(0.001)
        status = node.status()
        if status["links"]:  # still draining (three probe timeouts)
            assert (status["links"], status["closing"]) == (1, 1), status
        assert status["peers"] == {}, status
        async with asyncio.timeout(10):
            while node.status()["links"]:
                await asyncio.sleep(0.01)
        status = node.status()
        assert (status["closing"], status["peers"], status["verified"]) == (0, {}, 0), status
    finally:
        for endpoint in (session, node):
            await endpoint.close()
