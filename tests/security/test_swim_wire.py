"""SWIM wire attacks against the codec: each ends in a typed refusal, nothing accepted.

The adversary (`swim_adversary.Adversary`) signs with its own key through our codec;
the victim is a real `Codec` on a fixed clock. The same attacks over real UDP sockets,
against a running member, are in test_swim_udp.py.
"""

from __future__ import annotations

import json
import time

import pytest

from swactor.membership.messages import (
    MAX_INCARNATION,
    MAX_SEQ,
    Ack,
    AliveUpdate,
    DeadUpdate,
    ForgeryReason,
    Gossip,
    Ping,
    SuspectUpdate,
    Sync,
)
from swactor.membership.wire import (
    MAGIC,
    MAX_DATAGRAM,
    Codec,
    MembershipWireError,
    Signer,
)
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId
from tests.security.swim_adversary import Adversary, key_of, meta

T = 1_800_000_000.0
SRC = ("127.0.0.1", 4000)


def clock() -> float:
    return T


@pytest.fixture(scope="module")
def alice() -> NodeIdentity:
    return NodeIdentity.generate()


@pytest.fixture(scope="module")
def bob() -> NodeIdentity:
    return NodeIdentity.generate()


@pytest.fixture
def mallory() -> Adversary:
    adversary = Adversary(clock=clock)
    yield adversary  # type: ignore[misc]
    adversary.close()


def _victim(identity: NodeIdentity, pool: list[NodeIdentity] | None = None,
            **options: object) -> Codec:
    keys = None if pool is None else frozenset(key_of(i) for i in pool)
    return Codec(Signer(identity.private_key), allowed_keys=keys, clock=clock,
                 **options)  # type: ignore[arg-type]


def _reasons(codec: Codec, datagram: bytes) -> list[ForgeryReason]:
    decoded = codec.decode(datagram, SRC, 0.0)
    return [f.reason for f in decoded.forged]


# ------------------------------------------------------------------ replay and re-aiming


def test_a_captured_datagram_replayed_is_refused(alice: NodeIdentity,
                                                 bob: NodeIdentity) -> None:
    (datagram,) = _victim(alice).encode(Gossip(NodeId(alice.node_id), ()), NodeId(bob.node_id))
    victim = _victim(bob)
    assert victim.decode(datagram, SRC, 0.0).message == Gossip(NodeId(alice.node_id))
    replay = victim.decode(datagram, SRC, 1.0)
    assert replay.message is None
    assert [f.reason for f in replay.forged] == [ForgeryReason.Replayed]


def test_reordered_datagrams_within_the_window_are_accepted_once(
    alice: NodeIdentity, bob: NodeIdentity
) -> None:
    sender = _victim(alice)
    datagrams = [sender.encode(Ack(NodeId(alice.node_id), q), NodeId(bob.node_id))[0]
                 for q in range(1, 11)]
    victim = _victim(bob)
    for datagram in reversed(datagrams):
        assert victim.decode(datagram, SRC, 0.0).message is not None
    assert all(_reasons(victim, d) == [ForgeryReason.Replayed] for d in datagrams)


def test_a_datagram_re_aimed_at_another_member_is_refused(alice: NodeIdentity,
                                                          bob: NodeIdentity) -> None:
    carol = NodeIdentity.generate()
    (to_bob,) = _victim(alice).encode(Ping(NodeId(alice.node_id), 5, NodeId(bob.node_id)),
                                      NodeId(bob.node_id))
    assert _reasons(_victim(carol), to_bob) == [ForgeryReason.Misdirected]
    # rewriting the target field breaks the signature (it is signed)
    rewritten = to_bob[:4] + carol.node_id.to_bytes(8, "big") + to_bob[12:]
    assert _reasons(_victim(carol), rewritten) == [ForgeryReason.BadSignature]


def test_only_a_sync_may_be_sent_to_an_unknown_member(mallory: Adversary,
                                                      bob: NodeIdentity) -> None:
    ping = mallory.raw({"t": "ping", "s": mallory.node_id, "q": 1, "tg": bob.node_id,
                        "u": []}, to=0)
    assert _reasons(_victim(bob), ping) == [ForgeryReason.Misdirected]
    (join,) = mallory.encode(Sync(mallory.node_id, True), None)
    assert _victim(bob).decode(join, SRC, 0.0).message == Sync(mallory.node_id, True)


@pytest.mark.parametrize("skew_s", [-31.0, 31.0, -1e9, 1e9])
def test_a_datagram_outside_the_freshness_window_is_stale(mallory: Adversary,
                                                          bob: NodeIdentity,
                                                          skew_s: float) -> None:
    n = max(0, min((1 << 64) - 1, int((T + skew_s) * 1e6)))
    datagram = mallory.raw({"t": "gossip", "s": mallory.node_id, "u": []}, to=bob.node_id, n=n)
    assert _reasons(_victim(bob), datagram) == [ForgeryReason.Stale]


def test_a_flood_of_fresh_senders_is_refused_not_forgotten(bob: NodeIdentity) -> None:
    victim = _victim(bob, max_senders=8)
    crowd = [Adversary(clock=clock) for _ in range(9)]
    try:
        first = crowd[0].raw({"t": "gossip", "s": crowd[0].node_id, "u": []}, to=bob.node_id)
        assert victim.decode(first, SRC, 0.0).message is not None
        for adversary in crowd[1:8]:
            datagram = adversary.raw({"t": "gossip", "s": adversary.node_id, "u": []},
                                     to=bob.node_id)
            assert victim.decode(datagram, SRC, 0.0).message is not None
        late = crowd[8].raw({"t": "gossip", "s": crowd[8].node_id, "u": []}, to=bob.node_id)
        assert _reasons(victim, late) == [ForgeryReason.Flooded]
        # the first sender is still remembered: its datagram is still a replay
        assert _reasons(victim, first) == [ForgeryReason.Replayed]
    finally:
        for adversary in crowd:
            adversary.close()


# ------------------------------------------------------------------ forged updates


def test_a_foreign_key_claiming_a_pool_id_is_refused(mallory: Adversary, alice: NodeIdentity,
                                                     bob: NodeIdentity) -> None:
    body = {"t": "gossip", "s": alice.node_id, "u": []}
    pinned = _victim(bob, pool=[alice, bob])
    assert _reasons(pinned, mallory.raw(body, to=bob.node_id)) == [ForgeryReason.NotInPool]
    assert _reasons(_victim(bob), mallory.raw(body, to=bob.node_id)) == [
        ForgeryReason.NodeIdMismatch]


@pytest.mark.parametrize("kind", ["leave", "dead", "alive"])
def test_forged_updates_about_a_member_are_refused(mallory: Adversary, alice: NodeIdentity,
                                                   bob: NodeIdentity, kind: str) -> None:
    """Alice's leave, a dead claim "by alice" and an alive moving alice's address, all
    with a signature the victim once verified (mallory's own), or with mallory's key."""
    a = NodeId(alice.node_id)
    genuine = mallory.own(AliveUpdate(mallory.node_id, 0, meta(1)))
    update = {"leave": DeadUpdate(a, 0, a), "dead": DeadUpdate(NodeId(bob.node_id), 0, a),
              "alive": AliveUpdate(a, 9, meta(6666, "10.9.9.9"))}[kind]
    for pool in (None, [alice, bob, NodeIdentity.from_private_key(mallory.identity.private_key)]):
        victim = _victim(bob, pool)
        ok = mallory.raw({"t": "gossip", "s": mallory.node_id, "u": [genuine]}, to=bob.node_id)
        assert victim.decode(ok, SRC, 0.0).forged == ()  # mallory's signature now cached
        spliced = dict(Signer(alice.private_key).own_update(update))
        spliced["g"] = genuine["g"]  # a verified signature on a forged body
        rekeyed = mallory.own(update.__class__(*_fields(update)))  # mallory signs it herself
        for wire in (spliced, rekeyed):
            datagram = mallory.raw({"t": "gossip", "s": mallory.node_id, "u": [wire]},
                                   to=bob.node_id)
            decoded = victim.decode(datagram, SRC, 0.0)
            assert decoded.message == Gossip(mallory.node_id)  # nothing of it accepted
            (refusal,) = decoded.forged
            assert refusal.claimed == a
            assert refusal.reason in (ForgeryReason.BadSignature, ForgeryReason.NodeIdMismatch)


def _fields(update: AliveUpdate | DeadUpdate) -> tuple[object, ...]:
    if isinstance(update, AliveUpdate):
        return (update.node_id, update.incarnation, update.meta)
    return (update.node_id, update.incarnation, update.accuser)


def test_updates_by_a_key_outside_the_pool_are_refused(mallory: Adversary, alice: NodeIdentity,
                                                       bob: NodeIdentity) -> None:
    """A correctly self-signed dead claim by a stranger, relayed by a pool member."""
    victim = _victim(bob, pool=[alice, bob])
    claim = mallory.own(DeadUpdate(NodeId(alice.node_id), 0, mallory.node_id))
    relay = Adversary(alice, clock=clock)
    try:
        datagram = relay.raw({"t": "gossip", "s": alice.node_id, "u": [claim]}, to=bob.node_id)
        decoded = victim.decode(datagram, SRC, 0.0)
        assert decoded.message == Gossip(NodeId(alice.node_id))
        assert [(f.claimed, f.reason) for f in decoded.forged] == [
            (mallory.node_id, ForgeryReason.NotInPool)]
    finally:
        relay.close()


# ------------------------------------------------------------------ integer overflows


@pytest.mark.parametrize(("field", "where", "value"), [
    ("i", "update", MAX_INCARNATION + 1),
    ("i", "update", 10 ** 19),
    ("q", "body", MAX_SEQ + 1),
    ("tg", "body", 1 << 64),
    ("s", "body", -1),
])
def test_integers_out_of_range_are_refused(mallory: Adversary, bob: NodeIdentity, field: str,
                                           where: str, value: int) -> None:
    body: dict[str, object] = {"t": "ping", "s": mallory.node_id, "q": 1, "tg": bob.node_id,
                               "u": []}
    if where == "update":
        claim = {"k": "dead", "n": bob.node_id, "i": value, "a": mallory.node_id}
        body["u"] = [claim]
    else:
        body[field] = value
    with pytest.raises(MembershipWireError) as info:
        _victim(bob).decode(mallory.raw(body, to=bob.node_id), SRC, 0.0)
    assert info.value.field == field


def test_the_datagram_counter_at_its_limit_is_stale(mallory: Adversary,
                                                    bob: NodeIdentity) -> None:
    datagram = mallory.raw({"t": "gossip", "s": mallory.node_id, "u": []}, to=bob.node_id,
                           n=(1 << 64) - 1)
    assert _reasons(_victim(bob), datagram) == [ForgeryReason.Stale]


# ------------------------------------------------------------------ poison datagrams

_DEEP = b"[" * 4000 + b"]" * 4000
_HUGE = b'{"t":"ping","s":' + b"9" * 4300 + b"}"


@pytest.mark.parametrize(("body", "problem"), [
    (_DEEP, "nested"),
    (b'{"t":"gossip","u":[[[[[]]]]]}', "nested"),
    (_HUGE, "digits"),
    (b'{"t":"ping","s":1e999}', "float"),
    (b'{"t":"ping","s":NaN}', "float"),
    (b'{"t":"ping","s":"\xff"}', "UTF-8"),
    (b'{"t":"ping",}', "not JSON"),
    (b'{"t":"ping"', "unbalanced"),
])
def test_poison_bodies_are_a_typed_refusal(mallory: Adversary, bob: NodeIdentity, body: bytes,
                                           problem: str) -> None:
    with pytest.raises(MembershipWireError) as info:
        _victim(bob).decode(mallory.raw(body, to=bob.node_id), SRC, 0.0)
    assert info.value.field == "body" and problem in info.value.problem


@pytest.mark.parametrize("body", [_DEEP, _HUGE, b"x" * 7000])
def test_unsigned_poison_is_refused_before_it_is_parsed(mallory: Adversary, bob: NodeIdentity,
                                                        body: bytes) -> None:
    """A bad signature is found first: the body is never parsed (no typed body error)."""
    datagram = bytearray(mallory.raw(body, to=bob.node_id))
    datagram[-1] ^= 1
    assert _reasons(_victim(bob), bytes(datagram)) == [ForgeryReason.BadSignature]
    # and with a pool pinned, a stranger's datagram costs not even the signature check
    assert _reasons(_victim(bob, pool=[bob]), bytes(datagram)) == [ForgeryReason.NotInPool]


def test_truncated_oversized_and_wrong_version_datagrams(alice: NodeIdentity,
                                                         bob: NodeIdentity) -> None:
    (datagram,) = _victim(alice).encode(Gossip(NodeId(alice.node_id), ()), NodeId(bob.node_id))
    cases = {
        "length": datagram[:-1],
        "datagram": datagram[:20],
        "version": b"SWM1" + datagram[4:],
        "magic": b"HTTP" + datagram[4:],
    }
    for field, bad in cases.items():
        with pytest.raises(MembershipWireError) as info:
            _victim(bob).decode(bad, SRC, 0.0)
        assert info.value.field == field
    with pytest.raises(MembershipWireError) as info:
        _victim(bob).decode(MAGIC + bytes(MAX_DATAGRAM), SRC, 0.0)
    assert info.value.field == "datagram" and "limit" in info.value.problem


def test_too_many_updates_in_one_datagram_are_refused(mallory: Adversary,
                                                      bob: NodeIdentity) -> None:
    small = mallory.own(SuspectUpdate(NodeId(bob.node_id), 0, mallory.node_id))
    body = {"t": "gossip", "s": mallory.node_id, "u": [small] * 33}
    with pytest.raises(MembershipWireError) as info:
        _victim(bob).decode(mallory.raw(body, to=bob.node_id), SRC, 0.0)
    assert info.value.field == "u"


# ------------------------------------------------------------------ amplification


def test_an_answer_never_exceeds_its_budget(alice: NodeIdentity, bob: NodeIdentity) -> None:
    a = NodeId(alice.node_id)
    codec = _victim(alice)
    view = tuple(SuspectUpdate(NodeId(1000 + i), i, a) for i in range(200))
    for budget in (0, 100, 200, 500, 1500, MAX_DATAGRAM):
        datagrams = codec.encode(Sync(a, False, view), NodeId(bob.node_id), budget=budget)
        assert len(datagrams) <= 1
        assert sum(len(d) for d in datagrams) <= budget
    (full_ask,) = codec.encode(Sync(a, True), NodeId(bob.node_id))
    assert len(full_ask) == MAX_DATAGRAM  # asks for a view: padded so the answer may be a full one
    (answer,) = codec.encode(Sync(a, False, view), NodeId(bob.node_id), budget=len(full_ask))
    reply = _victim(bob).decode(answer, SRC, 0.0).message
    assert isinstance(reply, Sync) and len(reply.updates) > 20


def test_decoding_work_is_bounded(mallory: Adversary, bob: NodeIdentity) -> None:
    """The worst poison body (deepest nesting the size allows) is refused in bounded time."""
    victim = _victim(bob)
    body = b"[" * 4000 + b"]" * 4000
    start = time.perf_counter()
    for _ in range(50):
        with pytest.raises(MembershipWireError):
            victim.decode(mallory.raw(body, to=bob.node_id), SRC, 0.0)
    per = (time.perf_counter() - start) / 50
    print(f"\nSWIM poison datagram ({len(body)} B nesting) refused in {per * 1e6:.0f} us each "
          "(sign + verify + depth scan)")
    json.dumps(per)  # a figure, not a timing assertion
