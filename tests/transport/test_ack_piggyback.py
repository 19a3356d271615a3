"""A lone datagram's ACK waits for the work it set off, and rides with its answer;
two endpoints that dial each other put their streams on one link.

Two real endpoints on loopback. The receiver's handler answers each small object on the
same link only a few event-loop turns later (as an orchestrator does: its recv pump,
token reader and run actor each take a turn before the next token is written). The
receiver then sends one datagram per exchange, holding the ACK and the answer; an ACK
transmitted at once, as for a batch, would be a datagram of its own ahead of it.
"""

from __future__ import annotations

import asyncio

import pytest

from swactor.transport.config import ACK_HOLD_S, EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from tests.transport.ack_rig import Handler, pair, quiet

pytestmark = pytest.mark.timeout(60)
CONFIG = TransportConfig(max_datagram_size=1452)
TURNS = 3
"""Event-loop turns between an object's arrival and its answer."""


async def test_a_lone_datagrams_ack_rides_with_the_answer_it_set_off() -> None:
    async with pair(ACK_HOLD_S, Handler(answer_turns=TURNS)) as p:
        stream = p.link.open_uni_stream()
        sent: list[int] = []
        for n in range(1, 9):
            await quiet()
            before = p.answerer_sent.sent
            p.link.send(stream, bytes(44))
            await p.asker.until(44 * n)
            await asyncio.sleep(0.02)
            sent.append(p.answerer_sent.sent - before)
        assert p.answerer.got == 44 * 8
        # one datagram per exchange: the answer, carrying the ACK of the object
        assert sent[2:] == [1] * 6, sent


async def test_two_endpoints_that_dial_each_other_pick_one_link_for_their_streams() -> None:
    """A 1-stage run's orchestrator and node each dial the other for an edge: two links.
    Each end's send edge asks `shared_link` when it opens its stream; both get the same
    connection (the one the smaller node id dialled), whichever link each holds."""
    one_id, other_id = NodeIdentity.generate(), NodeIdentity.generate()
    one = QuicEndpoint(one_id, CONFIG, allowed={other_id.node_id})
    other = QuicEndpoint(other_id, CONFIG, allowed={one_id.node_id})
    one.register_handler(EDGE_ALPN, Handler())
    other.register_handler(EDGE_ALPN, Handler())
    try:
        await one.start()
        await other.start()
        mine, theirs = await asyncio.gather(
            one.connect(other_id.node_id, EDGE_ALPN, other.address),
            other.connect(one_id.node_id, EDGE_ALPN, one.address))
        async with asyncio.timeout(10):  # each end has verified the other's dial too
            while sum(1 for e in (one, other) for link in e._links
                      if link.peer_node_id is not None) < 4:
                await asyncio.sleep(0.01)
        assert mine.quic.host_cid != theirs.quic._peer_cid.cid, "two links"
        picked_one, picked_other = one.shared_link(mine), other.shared_link(theirs)
        assert picked_one.quic.host_cid == picked_other.quic._peer_cid.cid, "one connection"
        smaller = min(one_id.node_id, other_id.node_id)
        dialled_by_one = picked_one.quic._is_client
        assert (one_id.node_id if dialled_by_one else other_id.node_id) == smaller
        assert one.shared_link(picked_one) is picked_one, "asking again changes nothing"
    finally:
        await one.close()
        await other.close()
