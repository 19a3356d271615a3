"""The endpoint's link cache: a peer that comes back from a new endpoint is reached there.

An orchestrator's next session has a new endpoint with the same identity; the node may
still hold the previous session's link, open for a moment longer. Requests from the node
(its StageReady) must go on the new link, or they are lost when the old one closes.
"""

from __future__ import annotations

import asyncio

import pytest

from swactor.transport.config import CONTROL_ALPN, TransportConfig
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
