"""Hostile messages against the sans-I/O SWIM core: refused, typed, the victim unchanged.

These are messages that pass the wire layer (signed by their sender, who may be a pool
member or anyone in an open pool) but lie: acks from the wrong member, PingReqs for
strangers, claims with incarnations far ahead, a flood of invented members, an old leave
replayed. Normal SWIM semantics stay: a member may suspect another, and the victim
refutes with a higher incarnation.
"""

from __future__ import annotations

import random

from swactor.membership.config import SwimConfig
from swactor.membership.core import SwimCore
from swactor.membership.messages import (
    MAX_CLAIM_AHEAD,
    MAX_INCARNATION,
    Ack,
    AliveUpdate,
    DeadUpdate,
    Gossip,
    MemberMeta,
    MemberState,
    Nack,
    Ping,
    PingReq,
    RefusalReason,
    Refused,
    Refuted,
    SuspectUpdate,
    Sync,
)
from swactor.membership.wire import Codec, Signer
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

ME = NodeId(1)
CONFIG = SwimConfig()


def _meta(i: int) -> MemberMeta:
    return MemberMeta("sim", i)


def _core(members: int, config: SwimConfig = CONFIG) -> SwimCore:
    core = SwimCore(config, ME, _meta(1), random.Random(7))
    for i in range(2, members + 1):
        core.learn(AliveUpdate(NodeId(i), 0, _meta(i)), 0.0)
    core.start(0.0)
    core.take_events()
    return core


def _refusals(core: SwimCore) -> list[tuple[int, int, RefusalReason]]:
    return [(e.sender, e.node_id, e.reason) for e in core.take_events()
            if isinstance(e, Refused)]


def _first_probe(core: SwimCore) -> Ping:
    now = 0.0
    while now < 5.0:
        for out in core.tick(now):
            if isinstance(out.message, Ping):
                return out.message
        now += 0.01
    raise AssertionError("no probe sent")


# ------------------------------------------------------------------ acks


def test_an_ack_from_the_wrong_member_does_not_save_the_target() -> None:
    """(sequence, responder) must match: member 3 cannot answer for the probed target."""
    core = _core(3)
    ping = _first_probe(core)
    impostor = NodeId(3 if ping.target == 2 else 2)
    core.handle(Ack(impostor, ping.seq), ("sim", impostor), 0.05)
    assert _refusals(core) == [(impostor, ping.target, RefusalReason.WrongResponder)]
    core.handle(Nack(impostor, ping.seq), ("sim", impostor), 0.06)  # not a helper either
    assert [r[2] for r in _refusals(core)] == [RefusalReason.WrongResponder]
    now = 0.06
    while now < 3.0 and core.state_of(ping.target) is MemberState.Alive:
        core.tick(now)
        now += 0.01
    assert core.state_of(ping.target) is MemberState.Suspect  # the probe failed: no ack


def test_the_real_target_acks_and_sequence_numbers_are_not_guessable() -> None:
    core = _core(3)
    ping = _first_probe(core)
    core.handle(Ack(ping.target, ping.seq), ("sim", ping.target), 0.05)
    assert _refusals(core) == []
    seqs = {ping.seq}
    now = 0.1
    while now < 6.0:
        for out in core.tick(now):
            if isinstance(out.message, Ping):
                seqs.add(out.message.seq)
                core.handle(Ack(out.message.target, out.message.seq), out.address, now)
        now += 0.05
    assert len(seqs) >= 5
    assert all(s > 1000 for s in seqs)  # random, not 1, 2, 3...
    assert _refusals(core) == []


# ------------------------------------------------------------------ PingReq


def test_pingreq_for_a_stranger_or_from_a_stranger_is_refused() -> None:
    core = _core(3)
    assert core.handle(PingReq(NodeId(2), 9, NodeId(77)), ("sim", 2), 0.1) == []
    assert core.handle(PingReq(NodeId(77), 9, NodeId(2)), ("sim", 77), 0.1) == []
    assert [r[2] for r in _refusals(core)] == [RefusalReason.UnknownTarget] * 2


def test_pingreq_probes_the_address_in_the_view_not_the_one_asked_for() -> None:
    core = _core(3)
    out = core.handle(PingReq(NodeId(2), 9, NodeId(3)), ("elsewhere", 1), 0.1)
    assert [(o.address, type(o.message).__name__) for o in out] == [(("sim", 3), "Ping")]


def test_indirect_probes_are_bounded() -> None:
    core = _core(3, SwimConfig(max_relays=4))
    pings = [core.handle(PingReq(NodeId(2), q, NodeId(3)), ("sim", 2), 0.1) for q in range(6)]
    assert [len(p) for p in pings] == [1, 1, 1, 1, 0, 0]
    assert [r[2] for r in _refusals(core)] == [RefusalReason.RelayLimit] * 2


def test_unauthenticated_pingreq_is_answered_once_within_budget() -> None:
    core = _core(3)
    (ping,) = core.handle(PingReq(NodeId(2), 9, NodeId(3)), ("sim", 2), 0.0, budget=200)
    assert ping.budget == 200
    nacks = [o for o in core.tick(0.45) if isinstance(o.message, Nack)]
    assert [o.budget for o in nacks] == [200]
    assert core.handle(Ack(NodeId(3), ping.message.seq), ("sim", 3), 0.46) == []  # answered


def test_answers_to_unauthenticated_datagrams_carry_the_budget() -> None:
    core = _core(3)
    (ack,) = core.handle(Ping(NodeId(2), 5, ME), ("sim", 2), 0.1, budget=180)
    (sync,) = core.handle(Sync(NodeId(2), True), ("sim", 2), 0.2, budget=8192)
    (full,) = core.handle(Sync(NodeId(2), True), ("sim", 2), 0.3)
    assert (ack.budget, sync.budget, full.budget) == (180, 8192, None)


# ------------------------------------------------------------------ incarnation bomb


def test_a_claim_far_ahead_is_refused_and_the_victim_keeps_its_incarnation() -> None:
    core = _core(3)
    bomb = 10 ** 18
    core.handle(Gossip(NodeId(2), (DeadUpdate(ME, bomb, NodeId(2)),)), ("sim", 2), 1.0)
    core.handle(Gossip(NodeId(2), (SuspectUpdate(NodeId(3), bomb, NodeId(2)),)), ("sim", 2), 1.1)
    core.handle(Gossip(NodeId(2), (DeadUpdate(NodeId(3), MAX_INCARNATION, NodeId(2)),)),
                ("sim", 2), 1.2)
    assert _refusals(core) == [(2, ME, RefusalReason.ClaimTooFarAhead),
                               (2, 3, RefusalReason.ClaimTooFarAhead),
                               (2, 3, RefusalReason.ClaimTooFarAhead)]
    assert core.incarnation == 0
    view = core.view()[NodeId(3)]
    assert (view.state, view.incarnation) == (MemberState.Alive, 0)


def test_the_largest_claim_taken_is_refuted_encodably() -> None:
    """A claim at the bound is SWIM as usual: refuted, and the refutation is encodable."""
    identity = NodeIdentity.generate()
    me = NodeId(identity.node_id)
    core = SwimCore(CONFIG, me, _meta(1), random.Random(1))
    core.learn(AliveUpdate(NodeId(2), 0, _meta(2)), 0.0)
    core.start(0.0)
    for step in range(3):
        claim = core.incarnation + MAX_CLAIM_AHEAD
        core.handle(Gossip(NodeId(2), (SuspectUpdate(me, claim, NodeId(2)),)), ("sim", 2),
                    1.0 + step)
        assert core.incarnation == claim + 1
    refuted = [e for e in core.take_events() if isinstance(e, Refuted)]
    assert len(refuted) == 3
    codec = Codec(Signer(identity.private_key))
    (datagram,) = codec.encode(Gossip(me, (AliveUpdate(me, core.incarnation, _meta(1)),)),
                               NodeId(2))
    assert len(datagram) < 1024


def test_a_pool_member_may_still_suspect_another_and_the_victim_refutes() -> None:
    core = _core(3)
    core.handle(Gossip(NodeId(2), (SuspectUpdate(ME, 0, NodeId(2)),)), ("sim", 2), 1.0)
    core.handle(Gossip(NodeId(2), (DeadUpdate(ME, 1, NodeId(2)),)), ("sim", 2), 1.1)
    assert core.incarnation == 2
    assert _refusals(core) == []


# ------------------------------------------------------------------ leaves and tables


def test_a_replayed_leave_of_this_member_is_refuted_not_obeyed() -> None:
    """Its own leave from an earlier life, relayed back: refuted like a dead claim."""
    core = _core(3)
    core.handle(Gossip(NodeId(2), (DeadUpdate(ME, 0, ME),)), ("sim", 2), 1.0)
    assert core.incarnation == 1
    assert [e for e in core.take_events() if isinstance(e, Refuted)]
    core.leave(2.0)  # a real leave: its echo is ignored
    core.handle(Gossip(NodeId(2), (DeadUpdate(ME, 1, ME),)), ("sim", 2), 2.1)
    assert core.incarnation == 1


def test_the_member_table_is_bounded() -> None:
    core = _core(3, SwimConfig(max_members=10))
    flood = tuple(AliveUpdate(NodeId(100 + i), 0, _meta(100 + i)) for i in range(50))
    core.handle(Gossip(NodeId(2), flood), ("sim", 2), 1.0)
    core.handle(Sync(NodeId(2), False, flood), ("sim", 2), 1.1)
    assert len(core.view()) == 11  # the table's 10, and itself
    refused = _refusals(core)
    assert len(refused) == 2 * 42 and {r[2] for r in refused} == {RefusalReason.TableFull}


def test_invented_members_are_never_reconnect_targets() -> None:
    """A member only heard of (never answered a probe) is reaped, not synced for 24 h."""
    config = SwimConfig(reconnect_interval_s=5.0, push_pull_interval_s=1e9,
                        dead_retention_s=10.0)
    core = _core(2, config)
    core.handle(Gossip(NodeId(2), (AliveUpdate(NodeId(50), 0, _meta(50)),)), ("sim", 2), 0.5)
    core.handle(Gossip(NodeId(2), (DeadUpdate(NodeId(50), 0, NodeId(2)),)), ("sim", 2), 0.6)
    assert core.state_of(NodeId(50)) is MemberState.Dead
    syncs = []
    now = 1.0
    while now < 120.0:
        syncs += [o.address for o in core.tick(now)
                  if isinstance(o.message, Sync) and o.message.reply]
        now += 0.1
    assert ("sim", 50) not in syncs
    assert core.state_of(NodeId(50)) is None  # reaped after the retention
