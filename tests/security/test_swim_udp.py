"""SWIM attacks over real UDP sockets on loopback against running members.

Each victim is a real `MembershipNode` (its own thread and socket); the adversary
(`swim_adversary.Adversary`) sends from its own socket with our codec and its own key.
Every attack ends in a typed refusal counted by reason on the victim, and the victim's
view of the honest member (state, incarnation, metadata) is unchanged; anything the
victim sends back to an unauthenticated asker is measured and is never larger than what
was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from swactor.membership.config import MEMBERLIST_LAN, SwimConfig
from swactor.membership.messages import (
    AliveUpdate,
    DeadUpdate,
    ForgeryReason,
    Gossip,
    MemberMeta,
    MemberState,
    Ping,
    PingReq,
    RefusalReason,
    Sync,
)
from swactor.membership.udp import MembershipNode
from swactor.membership.wire import MAX_DATAGRAM, Signer
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId
from tests.security.swim_adversary import Adversary, key_of, members

CONFIG = MEMBERLIST_LAN.scaled(0.3)


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _node(identity: NodeIdentity, *, seeds: list[tuple[str, int]] | None = None,
          pool: list[NodeIdentity] | None = None,
          config: SwimConfig = CONFIG) -> MembershipNode:
    keys = None if pool is None else frozenset(key_of(i) for i in pool)
    node = MembershipNode(identity, config, MemberMeta("127.0.0.1", 0), seeds=seeds or [],
                          allowed_keys=keys)
    node.start()
    return node


class Pool:
    """A victim and an honest member joined to it (open, or pinned with `extra` keys)."""

    def __init__(self, pinned: bool, extra: list[NodeIdentity] = (),  # type: ignore[assignment]
                 config: SwimConfig = CONFIG) -> None:
        self.victim_id, self.bob_id = NodeIdentity.generate(), NodeIdentity.generate()
        pool = [self.victim_id, self.bob_id, *extra] if pinned else None
        self.victim = _node(self.victim_id, pool=pool, config=config)
        self.bob = _node(self.bob_id, seeds=[self.victim.address], pool=pool, config=config)
        self.b = NodeId(self.bob_id.node_id)
        _wait("bob alive at the victim",
              lambda: self._bob() is not None and self._bob().state is MemberState.Alive)

    def _bob(self) -> Any:
        return self.victim.view().get(self.b)

    def bob_as_seen(self) -> tuple[MemberState, int, MemberMeta]:
        view = self._bob()
        return (view.state, view.incarnation, view.meta)

    def close(self) -> None:
        self.bob.stop(leave=False)
        self.victim.stop(leave=False)


@pytest.fixture
def mallory() -> Iterator[Adversary]:
    adversary = Adversary()
    yield adversary
    adversary.close()


@pytest.fixture(params=["open", "pinned"])
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    pool = Pool(pinned=request.param == "pinned")
    yield pool
    pool.close()


def _settle(node: MembershipNode, counter: Callable[[], int], count: int) -> None:
    _wait(f"{count} refusals", lambda: counter() >= count)
    time.sleep(0.3)  # anything the forgery would have changed has had time to


# ------------------------------------------------------------------ forged updates


def test_forged_leave_dead_and_alive_leave_the_victim_unchanged(pool: Pool,
                                                                mallory: Adversary) -> None:
    before = pool.bob_as_seen()
    victim = pool.victim
    genuine = mallory.own(AliveUpdate(mallory.node_id, 0, before[2]))
    b = pool.b
    forged = []
    for update in (DeadUpdate(b, before[1], b),  # bob's leave
                   DeadUpdate(b, before[1] + 1, NodeId(pool.victim_id.node_id)),
                   AliveUpdate(b, before[1] + 5, MemberMeta("10.66.6.6", 9, "10.66.6.6", 9))):
        spliced = dict(Signer(pool.bob_id.private_key).own_update(update))
        spliced["p"] = genuine["p"]  # mallory's key and signature on bob's update
        spliced["g"] = genuine["g"]
        forged.append(spliced)
    for wire in [genuine, *forged]:
        mallory.send(mallory.raw({"t": "gossip", "s": mallory.node_id, "u": [wire]},
                                 to=victim.node_id), victim.address)
    reason = ForgeryReason.NotInPool if victim._codec.allowed_keys else None
    _settle(victim, lambda: sum(victim.forged.values()), 3 + (reason is not None))
    assert pool.bob_as_seen() == before
    if reason is not None:  # pinned: mallory's datagrams are refused whole
        assert victim.forged[ForgeryReason.NotInPool] == 4
    else:
        assert victim.forged[ForgeryReason.NodeIdMismatch] == 3


def test_a_replayed_datagram_is_refused(pool: Pool) -> None:
    """Bob's own genuine datagram, captured and sent again."""
    victim = pool.victim
    replayer = Adversary(pool.bob_id)
    try:
        (datagram,) = replayer.encode(Gossip(pool.b), victim.node_id)
        for _ in range(3):
            replayer.send(datagram, victim.address)
        _settle(victim, lambda: victim.forged[ForgeryReason.Replayed], 2)
        assert victim.forged[ForgeryReason.Replayed] == 2
    finally:
        replayer.close()


def test_an_incarnation_bomb_is_refused(mallory: Adversary) -> None:
    """From a pool member (so it passes the wire): a claim 10^18 ahead, and one with a
    4,300-digit incarnation; the victim's incarnation does not move."""
    pool = Pool(pinned=True, extra=[mallory.identity])
    try:
        victim = pool.victim
        me = victim.node_id
        incarnation = victim.view()[me].incarnation
        bomb = mallory.own(DeadUpdate(me, 10 ** 18, mallory.node_id))
        huge = json.dumps({"t": "gossip", "s": mallory.node_id, "u": [
            {"k": "dead", "n": me, "i": 0, "a": mallory.node_id}]}).replace(
            '"i": 0', '"i": ' + "9" * 4300).encode()
        mallory.send(mallory.raw({"t": "gossip", "s": mallory.node_id, "u": [bomb]}, to=me),
                     victim.address)
        mallory.send(mallory.raw(huge, to=me), victim.address)
        _settle(victim, lambda: victim.refused[RefusalReason.ClaimTooFarAhead], 1)
        assert victim.malformed == 1
        assert victim.view()[me].incarnation == incarnation
        assert pool.bob_as_seen()[0] is MemberState.Alive
    finally:
        pool.close()


# ------------------------------------------------------------------ poison


def test_poison_in_a_batch_does_not_cost_the_others_their_ack(mallory: Adversary) -> None:
    victim = _node(NodeIdentity.generate())
    try:
        batch = [poison for _ in range(2) for poison in (  # fits the socket buffer
            b"SWM1" + bytes(200), b"\x00" * 9000, b"SWM2" + bytes(20),
            mallory.raw(b"[" * 4000 + b"]" * 4000, to=victim.node_id),
            mallory.raw(b'{"t":"ping","s":' + b"9" * 4300 + b"}", to=victim.node_id),
            mallory.raw(b'{"t":"ping","s":1e999}', to=victim.node_id))]
        (ping,) = mallory.encode(Ping(mallory.node_id, 4242, victim.node_id), victim.node_id)
        for datagram in batch:
            mallory.send(datagram, victim.address)
        mallory.send(ping, victim.address)
        acks = [d for d in mallory.received(1.0) if b'"ack"' in d and b"4242" in d]
        assert len(acks) == 1 and len(acks[0]) <= len(ping)
        assert victim.malformed == len(batch)
        assert victim._thread.is_alive()
    finally:
        victim.stop(leave=False)


# ------------------------------------------------------------------ reflection and floods


def test_unauthenticated_asks_get_no_more_bytes_than_they_sent(mallory: Adversary) -> None:
    """An open pool with a 40-member view: a small Sync(reply=True) (x585 before) and a
    padded one, a ping, a PingReq for a stranger's address; bytes back <= bytes sent."""
    victim = _node(NodeIdentity.generate())
    try:
        crowd = members(40)
        for start in (0, 20):
            mallory.send(mallory.raw({"t": "gossip", "s": mallory.node_id,
                                      "u": [w for _, w in crowd[start:start + 20]]},
                                     to=victim.node_id), victim.address)
        _wait("a 40-member view", lambda: len(victim.view()) >= 41)
        mallory.received(0.2)
        small = mallory.raw({"t": "sync", "s": mallory.node_id, "r": True, "u": []},
                            to=victim.node_id)
        (padded,) = mallory.encode(Sync(mallory.node_id, True), victim.node_id)
        (ping,) = mallory.encode(Ping(mallory.node_id, 7, victim.node_id), victim.node_id)
        figures = []
        for ask in (small, padded, ping):
            mallory.send(ask, victim.address)
            back = [d for d in mallory.received(0.5) if b'"ping"' not in d]
            figures.append((len(ask), sum(len(d) for d in back)))
        print("\nSWIM unauthenticated ask -> answer bytes: "
              + ", ".join(f"{a} -> {b} ({b / a:.2f}x)" for a, b in figures))
        assert all(back <= ask for ask, back in figures)
        assert figures[1][1] > 4000  # the padded ask still gets a useful part of the view
    finally:
        victim.stop(leave=False)


def test_pingreq_never_makes_a_member_ping_an_address_it_was_given(mallory: Adversary) -> None:
    sink = Adversary()
    victim = _node(NodeIdentity.generate())
    try:
        (join,) = mallory.encode(Sync(mallory.node_id, False,
                                      (AliveUpdate(mallory.node_id, 0,
                                                   MemberMeta(*mallory.address)),)),
                                 victim.node_id)
        mallory.send(join, victim.address)
        _wait("mallory known", lambda: mallory.node_id in victim.view())
        stranger = NodeId(sink.node_id)
        for seq in range(20):
            (ask,) = mallory.encode(PingReq(mallory.node_id, seq, stranger), victim.node_id)
            mallory.send(ask, victim.address)
        _wait("20 refusals", lambda: victim.refused[RefusalReason.UnknownTarget] >= 20)
        assert sink.received(0.3) == []
    finally:
        victim.stop(leave=False)
        sink.close()


def test_a_stranger_gets_nothing_from_a_pinned_pool(mallory: Adversary) -> None:
    pool = Pool(pinned=True)
    try:
        victim = pool.victim
        (padded,) = mallory.encode(Sync(mallory.node_id, True), victim.node_id)
        (join,) = mallory.encode(Sync(mallory.node_id, True), None)
        (ping,) = mallory.encode(Ping(mallory.node_id, 7, victim.node_id), victim.node_id)
        for ask in (padded, join, ping):
            mallory.send(ask, victim.address)
        assert mallory.received(0.5) == []
        assert victim.forged[ForgeryReason.NotInPool] == 3
        # a pool member asking (authenticated) gets the whole view, however small its ask
        member = Adversary(pool.bob_id)
        try:
            small = member.raw({"t": "sync", "s": pool.b, "r": True, "u": []},
                               to=victim.node_id)
            member.send(small, victim.address)
            back = [d for d in member.received(0.5) if b'"sync"' in d]
            assert back and sum(len(d) for d in back) > len(small)
        finally:
            member.close()
    finally:
        pool.close()


@pytest.mark.parametrize("pinned", [False, True])
def test_a_member_table_flood_is_bounded(mallory: Adversary, pinned: bool) -> None:
    config = replace(MEMBERLIST_LAN, max_members=16).scaled(0.3)
    pool = Pool(pinned=pinned, config=config)
    try:
        victim = pool.victim
        crowd = members(60)
        for start in range(0, 60, 20):
            mallory.send(mallory.raw({"t": "gossip", "s": mallory.node_id,
                                      "u": [w for _, w in crowd[start:start + 20]]},
                                     to=victim.node_id), victim.address)
        if pinned:
            _settle(victim, lambda: victim.forged[ForgeryReason.NotInPool], 3)
            assert set(victim.view()) == {victim.node_id, pool.b}
        else:
            _settle(victim, lambda: victim.refused[RefusalReason.TableFull], 60 - 15)
            assert len(victim.view()) == 17  # 16 members and itself
        assert pool.bob_as_seen()[0] is MemberState.Alive
        assert len(crowd) * 300 > MAX_DATAGRAM  # (the flood is several datagrams)
    finally:
        pool.close()
