"""Signed SWIM datagrams: round trips, forgeries reported, malformed input typed.

Adversarial cases (replay, re-targeting, poison bodies, amplification) are in
tests/security/test_swim_*.py; this file holds the codec's ordinary contract.
"""

from __future__ import annotations

import itertools
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.membership.messages import (
    Ack,
    AliveUpdate,
    BootHealth,
    DeadUpdate,
    ForgeryReason,
    Gossip,
    MemberMeta,
    Message,
    Nack,
    Ping,
    PingReq,
    SuspectUpdate,
    Sync,
)
from swactor.membership.wire import (
    MAGIC,
    Codec,
    MembershipWireError,
    Signer,
    public_key_raw,
    seal,
)
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

SRC = ("127.0.0.1", 4000)
T = 1_800_000_000.0
"""A fixed wall clock for every codec here (freshness is tested in tests/security)."""
_COUNTER = itertools.count(int(T * 1e6))


def _codec(identity: NodeIdentity, allowed_keys: frozenset[bytes] | None = None) -> Codec:
    return Codec(Signer(identity.private_key), allowed_keys=allowed_keys, clock=lambda: T)


@pytest.fixture(scope="module")
def alice() -> NodeIdentity:
    return NodeIdentity.generate()


@pytest.fixture(scope="module")
def bob() -> NodeIdentity:
    return NodeIdentity.generate()


def _meta(port: int) -> MemberMeta:
    return MemberMeta("10.0.0.1", port, "10.0.0.1", 7000, BootHealth.Available, "cuda",
                      80 << 30, "node")


def test_every_message_type_round_trips(alice: NodeIdentity, bob: NodeIdentity) -> None:
    a, b = NodeId(alice.node_id), NodeId(bob.node_id)
    tx, rx = _codec(alice), _codec(bob)
    alive = AliveUpdate(a, 3, _meta(5000))
    updates = (alive, SuspectUpdate(b, 1, a), DeadUpdate(NodeId(99), 2, a), DeadUpdate(a, 4, a))
    messages: list[Message] = [
        Ping(a, 1, b, updates), Ack(a, 2), Nack(a, 3, (alive,)),
        PingReq(a, 4, b, True, updates), Gossip(a, updates), Sync(a, True, (alive,)),
    ]
    for message in messages:
        (datagram,) = tx.encode(message, b)
        decoded = rx.decode(datagram, SRC, 1.0)
        assert decoded.forged == ()
        assert decoded.message == message
        assert decoded.size == len(datagram)
        assert not decoded.authenticated  # an open pool: nothing is authenticated


def test_relayed_update_keeps_its_author_signature(alice: NodeIdentity,
                                                   bob: NodeIdentity) -> None:
    carol = NodeIdentity.generate()
    a, b, c = NodeId(alice.node_id), NodeId(bob.node_id), NodeId(carol.node_id)
    alive = AliveUpdate(a, 7, _meta(5000))
    at_bob, at_carol = _codec(bob), _codec(carol)
    (first,) = _codec(alice).encode(Gossip(a, (alive,)), b)
    assert at_bob.decode(first, SRC, 0.0).message == Gossip(a, (alive,))
    (relayed,) = at_bob.encode(Gossip(b, (alive,)), c)  # bob relays alice's update
    decoded = at_carol.decode(relayed, SRC, 0.0)
    assert decoded.forged == () and decoded.message == Gossip(b, (alive,))
    # an update bob never verified is not re-signed by him: it is left out
    (empty,) = at_bob.encode(Gossip(b, (AliveUpdate(a, 8, _meta(5000)),)), c)
    assert at_carol.decode(empty, SRC, 0.0).message == Gossip(b)


def _forge(body: dict[str, object], signer: NodeIdentity, to: NodeIdentity | None) -> bytes:
    return seal(json.dumps(body).encode(), signer.private_key,
                to=0 if to is None else to.node_id, n=next(_COUNTER))


def test_datagram_claiming_another_node_id_is_dropped_and_reported(
    alice: NodeIdentity, bob: NodeIdentity
) -> None:
    mallory = NodeIdentity.generate()
    datagram = _forge({"t": "ping", "s": alice.node_id, "q": 1, "tg": bob.node_id, "u": []},
                      mallory, bob)
    decoded = _codec(bob).decode(datagram, SRC, 2.0)
    assert decoded.message is None
    (forged,) = decoded.forged
    assert (forged.claimed, forged.reason, forged.source) == (
        alice.node_id, ForgeryReason.NodeIdMismatch, SRC)


def test_tampered_datagram_fails_its_signature(alice: NodeIdentity, bob: NodeIdentity) -> None:
    (datagram,) = _codec(alice).encode(Ack(NodeId(alice.node_id), 12345), NodeId(bob.node_id))
    tampered = datagram.replace(b"12345", b"12346")
    assert tampered != datagram
    decoded = _codec(bob).decode(tampered, SRC, 0.0)
    assert decoded.message is None
    assert [f.reason for f in decoded.forged] == [ForgeryReason.BadSignature]


def test_forged_update_inside_a_genuine_datagram_is_dropped_alone(
    alice: NodeIdentity, bob: NodeIdentity
) -> None:
    mallory = NodeIdentity.generate()
    m = NodeId(mallory.node_id)
    genuine = Signer(mallory.private_key).own_update(AliveUpdate(m, 0, _meta(1)))
    fake = dict(Signer(mallory.private_key).own_update(
        SuspectUpdate(NodeId(alice.node_id), 9, m)))
    fake["a"] = alice.node_id  # now claims alice accused, but mallory signed it
    datagram = _forge({"t": "gossip", "s": mallory.node_id, "u": [genuine, fake]}, mallory, bob)
    decoded = _codec(bob).decode(datagram, SRC, 0.0)
    assert decoded.message == Gossip(m, (AliveUpdate(m, 0, _meta(1)),))
    assert [(f.claimed, f.reason) for f in decoded.forged] == [
        (alice.node_id, ForgeryReason.NodeIdMismatch)]


def _pin(*identities: NodeIdentity) -> frozenset[bytes]:
    return frozenset(public_key_raw(i.private_key) for i in identities)


def test_sender_whose_key_is_not_pinned_is_rejected(alice: NodeIdentity,
                                                    bob: NodeIdentity) -> None:
    (datagram,) = _codec(alice).encode(Ack(NodeId(alice.node_id), 1), NodeId(bob.node_id))
    decoded = _codec(bob, _pin(bob)).decode(datagram, SRC, 0.0)
    assert decoded.message is None
    assert [f.reason for f in decoded.forged] == [ForgeryReason.NotInPool]
    decoded = _codec(bob, _pin(alice, bob)).decode(datagram, SRC, 0.0)
    assert decoded.message == Ack(NodeId(alice.node_id), 1)
    assert decoded.authenticated  # pinned key, addressed to bob


def test_pinned_keys_must_be_raw_ed25519_keys(bob: NodeIdentity) -> None:
    with pytest.raises(ValueError, match="32"):
        Codec(Signer(bob.private_key), allowed_keys=[b"short"])


def test_a_verified_signature_does_not_vouch_for_another_update(
    alice: NodeIdentity, bob: NodeIdentity
) -> None:
    """Replaying one valid update signature onto a forged update (a leave of bob) fails."""
    mallory = NodeIdentity.generate()
    m, b = NodeId(mallory.node_id), NodeId(bob.node_id)
    rx = _codec(alice)
    genuine = Signer(mallory.private_key).own_update(AliveUpdate(m, 0, _meta(1)))
    assert rx.decode(_forge({"t": "gossip", "s": m, "u": [genuine]}, mallory, alice), SRC,
                     0.0).forged == ()
    forged_leave = dict(_codec(bob).signer.own_update(DeadUpdate(b, 0, b)))
    forged_leave["g"] = genuine["g"]  # a signature alice's codec verified before
    decoded = rx.decode(_forge({"t": "gossip", "s": m, "u": [forged_leave]}, mallory, alice),
                        SRC, 0.0)
    assert decoded.message == Gossip(m)
    assert [(f.claimed, f.reason) for f in decoded.forged] == [(b, ForgeryReason.BadSignature)]
    # and bob's key with mallory's body (mallory's alive, re-keyed to bob): refused too
    rekeyed = dict(genuine)
    rekeyed["p"] = forged_leave["p"]
    decoded = rx.decode(_forge({"t": "gossip", "s": m, "u": [rekeyed]}, mallory, alice),
                        SRC, 0.0)
    assert [f.reason for f in decoded.forged] == [ForgeryReason.NodeIdMismatch]


def test_large_sync_is_split_and_only_the_first_chunk_asks_for_a_reply(
    alice: NodeIdentity, bob: NodeIdentity
) -> None:
    a = NodeId(alice.node_id)
    tx, rx = _codec(alice), _codec(bob)
    updates = tuple(DeadUpdate(NodeId(1000 + i), i, a) for i in range(400))
    datagrams = tx.encode(Sync(a, True, updates), NodeId(bob.node_id))
    assert len(datagrams) > 1
    assert all(len(d) <= tx.max_datagram for d in datagrams)
    decoded = [rx.decode(d, SRC, 0.0).message for d in datagrams]
    assert [isinstance(m, Sync) and m.reply for m in decoded] == [True] + [False] * (
        len(datagrams) - 1)
    got = tuple(u for m in decoded if m is not None for u in m.updates)
    assert got == updates


_HEAD = struct.Struct(">4sQQH")


def _raw(body: bytes, *, magic: bytes = MAGIC, length: int | None = None) -> bytes:
    return _HEAD.pack(magic, 0, 0, len(body) if length is None else length) + body + bytes(96)


@pytest.mark.parametrize(
    ("datagram", "field"),
    [
        (b"short", "datagram"),
        (b"XXXX" + bytes(200), "magic"),
        (_raw(b"{}", magic=b"SWM1"), "version"),
        (_raw(b"{}", length=10), "length"),
        (bytes(9000), "datagram"),
    ],
)
def test_malformed_datagrams_raise_a_typed_error_naming_the_field(
    bob: NodeIdentity, datagram: bytes, field: str
) -> None:
    with pytest.raises(MembershipWireError) as info:
        _codec(bob).decode(datagram, SRC, 0.0)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{x}", "body"),
        (b"[]", "body"),
        (b'{"s":-1}', "s"),
    ],
)
def test_malformed_signed_bodies_raise_a_typed_error_naming_the_field(
    alice: NodeIdentity, bob: NodeIdentity, body: bytes, field: str
) -> None:
    datagram = seal(body, alice.private_key, to=bob.node_id, n=next(_COUNTER))
    with pytest.raises(MembershipWireError) as info:
        _codec(bob).decode(datagram, SRC, 0.0)
    assert info.value.field == field


_FUZZ_ID = NodeIdentity.generate()
_FUZZ_SENDER = NodeId(_FUZZ_ID.node_id)
_FUZZ_DATAGRAM = _codec(_FUZZ_ID).encode(
    Ping(_FUZZ_SENDER, 1, NodeId(2), (AliveUpdate(_FUZZ_SENDER, 0, _meta(1)),)),
    _FUZZ_SENDER)[0]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 10_000))
def test_mutated_datagrams_decode_or_raise_wire_error(cut: bytes, at: int) -> None:
    at %= len(_FUZZ_DATAGRAM)
    mutated = _FUZZ_DATAGRAM[:at] + cut + _FUZZ_DATAGRAM[at + len(cut):]
    try:
        decoded = _codec(_FUZZ_ID).decode(mutated, SRC, 0.0)
    except MembershipWireError:
        return
    if mutated != _FUZZ_DATAGRAM:
        # any change to the signed part is caught by the signature, never accepted
        assert decoded.message is None
        assert decoded.forged
