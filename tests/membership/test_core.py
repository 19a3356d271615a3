"""SwimCore driven by hand: Lifeguard's dynamic suspicion, local health, nacks, refutation."""

from __future__ import annotations

import itertools
import math
import random

from swactor.membership.config import MEMBERLIST_LAN
from swactor.membership.core import SwimCore
from swactor.membership.messages import (
    Ack,
    AliveUpdate,
    DeadUpdate,
    Gossip,
    MemberMeta,
    MemberState,
    Nack,
    Outgoing,
    Ping,
    PingReq,
    Refuted,
    SuspectUpdate,
)
from swactor.wire import NodeId

ME = NodeId(1)
CONFIG = MEMBERLIST_LAN  # the tests work memberlist's numbers by hand


def _meta(i: int) -> MemberMeta:
    return MemberMeta("sim", i)


def _core(members: int) -> SwimCore:
    core = SwimCore(CONFIG, ME, _meta(1), random.Random(7))
    for i in range(2, members + 1):
        core.learn(AliveUpdate(NodeId(i), 0, _meta(i)), 0.0)
    core.start(0.0)
    return core


def _suspect(core: SwimCore, target: int, accuser: int, now: float) -> None:
    core.handle(Gossip(NodeId(accuser), (SuspectUpdate(NodeId(target), 0, NodeId(accuser)),)),
                ("sim", accuser), now)


def _dead_at(core: SwimCore, target: int, until: float, step: float = 0.05) -> float | None:
    now = 0.0
    while now < until:
        core.tick(now)
        if core.state_of(NodeId(target)) is MemberState.Dead:
            return now
        now += step
    return None


def test_unconfirmed_suspicion_lasts_the_maximum_timeout() -> None:
    # Lifeguard with memberlist's numbers, N = 10: min = 4 * max(1, log10 10) * 1 s = 4 s,
    # max = 6 * min = 24 s.
    core = _core(10)
    _suspect(core, 5, accuser=2, now=0.0)
    died = _dead_at(core, 5, 30.0)
    assert died is not None and 23.9 <= died <= 24.1


def test_each_independent_confirmation_shortens_the_timeout() -> None:
    core = _core(10)
    _suspect(core, 5, accuser=2, now=0.0)
    _suspect(core, 5, accuser=2, now=0.0)  # the same accuser again is no confirmation
    _suspect(core, 5, accuser=3, now=0.0)  # one confirmation of k = 4 - 2 = 2 expected
    expected = 24.0 - (24.0 - 4.0) * math.log(2) / math.log(3)
    died = _dead_at(core, 5, 30.0)
    assert died is not None and abs(died - expected) <= 0.06
    other = _core(10)
    for accuser in (2, 3, 4, 6):  # k confirmations or more: the minimum
        _suspect(other, 5, accuser=accuser, now=0.0)
    died = _dead_at(other, 5, 30.0)
    assert died is not None and 3.95 <= died <= 4.05


def _pings(out: list[Outgoing]) -> list[Ping]:
    return [o.message for o in out if isinstance(o.message, Ping)]


def test_failed_probes_raise_local_health_and_stretch_the_probe_period() -> None:
    # One peer (so no indirect probes: every failure counts +1) whose acks never arrive
    # but whose refutations do (one-way loss), so it stays a probe target.
    core = _core(2)
    ping_times: list[float] = []
    incarnation = 0
    now = 0.0
    while now < 60.0:
        if _pings(core.tick(now)):
            ping_times.append(now)
        if core.state_of(NodeId(2)) is MemberState.Suspect:
            incarnation += 1
            core.handle(Gossip(NodeId(2), (AliveUpdate(NodeId(2), incarnation, _meta(2)),)),
                        ("sim", 2), now)
        now += 0.01
    gaps = [b - a for a, b in itertools.pairwise(ping_times)]
    assert core.awareness == CONFIG.awareness_max_multiplier - 1
    assert gaps[0] < 1.1  # healthy: one probe per second
    assert max(gaps) > 7.9  # at the cap: probe period x8


def test_acked_probes_bring_local_health_back_down() -> None:
    core = _core(2)
    core.awareness = 3
    now = 0.0
    while now < 30.0 and core.awareness:
        for ping in _pings(core.tick(now)):
            core.handle(Ack(NodeId(2), ping.seq), ("sim", 2), now + 0.01)
        now += 0.01
    assert core.awareness == 0


def test_intermediary_nacks_when_the_target_stays_silent() -> None:
    core = _core(3)
    out = core.handle(PingReq(NodeId(2), 99, NodeId(3)), ("sim", 2), 0.0)
    (ping,) = _pings(out)
    assert out[0].address == ("sim", 3)
    assert not [o for o in core.tick(0.39) if isinstance(o.message, Nack)]
    nacks = [(o.address, o.message.seq) for o in core.tick(0.41) if isinstance(o.message, Nack)]
    assert nacks == [(("sim", 2), 99)]
    # an ack that arrives for the relayed ping is forwarded to the origin with its seq
    core2 = _core(3)
    (ping2,) = _pings(core2.handle(PingReq(NodeId(2), 98, NodeId(3)), ("sim", 2),
                                   0.0))
    forwarded = core2.handle(Ack(NodeId(3), ping2.seq), ("sim", 3), 0.1)
    assert [(o.address, type(o.message).__name__, getattr(o.message, "seq", None))
            for o in forwarded] == [(("sim", 2), "Ack", 98)]
    assert ping.target == NodeId(3)


def test_claims_about_itself_are_refuted_past_their_incarnation() -> None:
    core = _core(3)
    core.handle(Gossip(NodeId(2), (SuspectUpdate(ME, 0, NodeId(2)),)), ("sim", 2), 1.0)
    assert core.incarnation == 1
    core.handle(Gossip(NodeId(3), (DeadUpdate(ME, 5, NodeId(3)),)), ("sim", 3), 2.0)
    assert core.incarnation == 6
    refuted = [e for e in core.take_events() if isinstance(e, Refuted)]
    assert [(e.accuser, e.incarnation) for e in refuted] == [(2, 1), (3, 6)]
    # a stale claim is not refuted again, but our alive rides on the next message
    core.handle(Gossip(NodeId(2), (SuspectUpdate(ME, 2, NodeId(2)),)), ("sim", 2), 3.0)
    assert core.incarnation == 6
    (reply,) = core.handle(Ping(NodeId(2), 7, ME), ("sim", 2), 3.1)
    assert AliveUpdate(ME, 6, _meta(1)) in reply.message.updates


def test_newer_alive_refutes_a_suspicion_and_revives_the_dead() -> None:
    core = _core(3)
    _suspect(core, 2, accuser=3, now=0.0)
    assert core.state_of(NodeId(2)) is MemberState.Suspect
    core.handle(Gossip(NodeId(3), (AliveUpdate(NodeId(2), 0, _meta(2)),)), ("sim", 3), 0.1)
    assert core.state_of(NodeId(2)) is MemberState.Suspect  # same incarnation: no refutation
    core.handle(Gossip(NodeId(2), (AliveUpdate(NodeId(2), 1, _meta(2)),)), ("sim", 2), 0.2)
    assert core.state_of(NodeId(2)) is MemberState.Alive
    core.handle(Gossip(NodeId(3), (DeadUpdate(NodeId(2), 1, NodeId(3)),)), ("sim", 3), 0.3)
    assert core.state_of(NodeId(2)) is MemberState.Dead
    core.handle(Gossip(NodeId(2), (AliveUpdate(NodeId(2), 2, _meta(2)),)), ("sim", 2), 0.4)
    assert core.state_of(NodeId(2)) is MemberState.Alive


def test_an_acked_probes_timeout_wakes_nobody() -> None:
    """The runner sleeps until `next_deadline`: once the probe is acked its timeout
    would do nothing, so the deadline is the next timer that has work; a probe left
    unacked still wakes the member at its timeout (and goes on to indirect probes)."""
    acked, silent = _core(3), _core(3)
    for core, answer in ((acked, True), (silent, False)):
        now = 0.0
        while not (pings := _pings(core.tick(now))):
            now += 0.01
        timeout = now + CONFIG.probe_timeout_s
        if answer:
            core.handle(Ack(pings[0].target, pings[0].seq), ("sim", int(pings[0].target)),
                        now + 0.001)
            seen = []
            t = core.next_deadline()
            while t <= timeout:  # every wake-up up to the timeout
                seen.append(t)
                core.tick(t)
                t = core.next_deadline()
            assert timeout not in seen
        else:
            assert min(core.next_deadline(), timeout) == core.next_deadline()
            t = core.next_deadline()
            while t < timeout:  # other timers (gossip) may come first
                core.tick(t)
                t = core.next_deadline()
            assert t == timeout
            assert any(isinstance(o.message, PingReq) for o in core.tick(t))
