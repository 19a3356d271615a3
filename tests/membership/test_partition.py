"""A partition heals once the link is back: reconnect syncs re-merge the two views.

Both sides of a cut declare each other dead (and, past the dead retention, reap each
other). Plain SWIM never probes a dead member again, so without the reconnect sync the
views stay split forever; with it every member is alive in every view within a few
reconnect periods of the heal, inside `heal_bound_s`. The simulator runs the defaults
(`SwimConfig()`), so the figures are in real seconds. The core-level tests pin the rules
the heal rests on: a full view's dead claims become suspicions, only dead (not left)
members are retried, round robin.
"""

from __future__ import annotations

import random

import pytest

from swactor.membership.config import SwimConfig, heal_bound_s, reconnect_period_s
from swactor.membership.core import SwimCore
from swactor.membership.messages import (
    AliveUpdate,
    DeadUpdate,
    Gossip,
    MemberChanged,
    MemberMeta,
    MemberState,
    Refuted,
    Sync,
)
from swactor.testing.swim_sim import Simulation, sim_node_id
from swactor.wire import NodeId

WARMUP_S = 5.0
HEAL_PERIODS = 3
"""The control runs this many reconnect intervals past the heal."""


def _all_alive(sim: Simulation) -> bool:
    ids = [m.core.node_id for m in sim.members]
    return all(
        m.core.state_of(other) is MemberState.Alive
        for m in sim.members for other in ids
    )


def _split(sim: Simulation, side: list[int], other: list[int]) -> bool:
    """Every member of `side` holds every member of `other` dead or forgotten."""
    return all(
        sim.members[o].core.state_of(sim_node_id(t)) in (MemberState.Dead, None)
        for o in side for t in other
    )


@pytest.mark.parametrize(("members", "cut", "partition_s"), [
    (3, [1], 45.0),      # the multihost shape: one of three stage hosts cut off, dead
    (3, [1], 150.0),     # ... and reaped on both sides (dead retention 60 s)
    (12, [0, 1, 2, 3], 45.0),
    (12, [0, 1, 2, 3], 150.0),
])
def test_partition_heals_within_the_heal_bound(
    members: int, cut: list[int], partition_s: float
) -> None:
    sim = Simulation(members, seed=members + int(partition_s))
    rest = [i for i in range(members) if i not in cut]
    sim.run_until(WARMUP_S)
    assert _all_alive(sim)
    sim.partition(cut, rest)
    sim.run_until(WARMUP_S + partition_s)
    assert sim.cut > 0
    assert _split(sim, cut, rest) and _split(sim, rest, cut), "the cut never split the views"
    healed_at = sim.now
    sim.heal()
    interval = sim.config.reconnect_interval_s
    bound = heal_bound_s(sim.config, members, held_dead=max(len(cut), len(rest)))
    while not _all_alive(sim) and sim.now < healed_at + bound:
        sim.run_until(sim.now + 0.05)
    took = sim.now - healed_at
    print(f"\nN={members}, {len(cut)} cut for {partition_s:.0f}s: every view all alive "
          f"{took:.2f}s after the heal (bound {bound:.2f}s)")
    assert _all_alive(sim), {
        i: {int(n): v.state.value for n, v in m.core.view().items()}
        for i, m in enumerate(sim.members)
    }
    # and it stays healed: no member is declared dead again once the views merged
    merged_at = sim.now
    sim.run_until(merged_at + 2 * interval)
    late_deaths = [(t, i, e.node_id) for t, i, e in sim.events if t > merged_at
                   and isinstance(e, MemberChanged) and e.state is MemberState.Dead]
    assert late_deaths == []
    assert _all_alive(sim)


def _heal_time(members: int, cut: list[int], seed: int, partition_s: float) -> float:
    sim = Simulation(members, seed=seed)
    rest = [i for i in range(members) if i not in cut]
    sim.run_until(WARMUP_S)
    sim.partition(cut, rest)
    sim.run_until(WARMUP_S + partition_s)
    healed_at = sim.now
    sim.heal()
    bound = heal_bound_s(sim.config, members, held_dead=max(len(cut), len(rest)))
    while not _all_alive(sim) and sim.now < healed_at + 3 * bound:
        sim.run_until(sim.now + 0.05)
    assert _all_alive(sim)
    return sim.now - healed_at


@pytest.mark.parametrize(("members", "cut"), [(3, [1]), (4, [0]), (5, [1, 2])])
def test_every_seed_heals_within_the_bound(members: int, cut: list[int]) -> None:
    # 20 seeds and partitions of 20-100 s (dead on both sides, reaped or not): the bound
    # is a bound, not a median.
    times = sorted(_heal_time(members, cut, seed, 20.0 + 4 * seed) for seed in range(20))
    bound = heal_bound_s(SwimConfig(), members, held_dead=max(len(cut), members - len(cut)))
    print(f"\nN={members}, {len(cut)} cut: heal median {times[10]:.2f}s, worst "
          f"{times[-1]:.2f}s over 20 seeds (bound {bound:.2f}s)")
    assert times[-1] <= bound


def test_control_without_reconnect_the_partition_never_heals() -> None:
    # The same shape with the reconnect sync pushed beyond the run: the views stay split,
    # so the heal above is the reconnect sync's doing.
    never = SwimConfig(reconnect_interval_s=1e9)
    sim = Simulation(3, seed=48, config=never)
    sim.run_until(WARMUP_S)
    sim.partition([1], [0, 2])
    sim.run_until(WARMUP_S + 45.0)
    sim.heal()
    sim.run_until(sim.now + 60.0)
    assert not _all_alive(sim)
    assert _split(sim, [1], [0, 2]) and _split(sim, [0, 2], [1])


# ------------------------------------------------------------------ core rules

ME = NodeId(1)


def _meta(i: int) -> MemberMeta:
    return MemberMeta("sim", i)


def _core(members: int, config: SwimConfig | None = None) -> SwimCore:
    core = SwimCore(config or SwimConfig(), ME, _meta(1), random.Random(7))
    for i in range(2, members + 1):
        core.learn(AliveUpdate(NodeId(i), 0, _meta(i)), 0.0)
    core.start(0.0)
    return core


def test_a_dead_claim_in_a_synced_view_only_makes_the_member_suspect() -> None:
    core = _core(3)
    claim = DeadUpdate(NodeId(3), 0, NodeId(2))
    core.handle(Sync(NodeId(2), False, (claim,)), ("sim", 2), 1.0)
    assert core.state_of(NodeId(3)) is MemberState.Suspect
    # the same claim gossiped (fresh news, not a stored view) is still a verdict
    core.handle(Gossip(NodeId(2), (claim,)), ("sim", 2), 1.1)
    assert core.state_of(NodeId(3)) is MemberState.Dead


def test_a_synced_dead_claim_about_itself_is_refuted_in_the_reply() -> None:
    core = _core(3)
    (reply,) = core.handle(Sync(NodeId(2), True, (DeadUpdate(ME, 4, NodeId(2)),)),
                           ("sim", 2), 1.0)
    assert core.incarnation == 5
    assert [e for e in core.take_events() if isinstance(e, Refuted)]
    assert isinstance(reply.message, Sync) and reply.address == ("sim", 2)
    assert AliveUpdate(ME, 5, _meta(1)) in reply.message.updates


def test_reconnect_syncs_the_dead_but_not_those_that_left() -> None:
    config = SwimConfig(reconnect_interval_s=10.0, push_pull_interval_s=1e9)
    core = _core(3, config)
    core.handle(Gossip(NodeId(3), (DeadUpdate(NodeId(2), 0, NodeId(3)),
                                   DeadUpdate(NodeId(3), 0, NodeId(3)))), ("sim", 3), 1.0)
    assert core.state_of(NodeId(2)) is MemberState.Dead
    assert core.state_of(NodeId(3)) is MemberState.Left
    synced: list[tuple[float, object]] = []
    now = 1.0
    while now < 200.0:  # past the dead retention (60 s): member 2 is reaped, still retried
        synced += [(now, o.address) for o in core.tick(now)
                   if isinstance(o.message, Sync) and o.message.reply]
        now += 0.1
    assert core.state_of(NodeId(2)) is None
    assert [address for _, address in synced] == [("sim", 2)] * 19  # at 10, 20 .. 190 s
    assert max(t for t, _ in synced) > 190.0
    # the sync carries the full view, so the dead member learns what we hold about it
    reconnect = core.tick(210.0)
    (sync,) = [o.message for o in reconnect if isinstance(o.message, Sync)]
    assert AliveUpdate(ME, 0, _meta(1)) in sync.updates


def test_reconnect_rounds_visit_every_dead_member_round_robin() -> None:
    # 5 dead members, 2 per round: each is synced within ceil(5 / 2) = 3 rounds, and
    # every round names distinct members (a random pick could miss one for many rounds).
    # (no probes, so the living member 7 is never declared dead by this core)
    config = SwimConfig(reconnect_interval_s=1.0, reconnect_nodes=2, push_pull_interval_s=1e9,
                        probe_interval_s=1e6, probe_timeout_s=1.0)
    core = _core(7, config)  # learned members count as confirmed: reconnect targets
    core.handle(Gossip(NodeId(7), tuple(DeadUpdate(NodeId(i), 0, NodeId(7))
                                        for i in range(2, 7))), ("sim", 7), 0.5)
    rounds: list[list[object]] = []
    now = 0.5
    while now < 20.0:
        synced = [o.address for o in core.tick(now)
                  if isinstance(o.message, Sync) and o.message.reply]
        if synced:
            rounds.append(synced)
        now += 0.05
    assert all(len(r) == 2 and len(set(r)) == 2 for r in rounds)
    for start in range(len(rounds) - 2):
        window = {a for r in rounds[start:start + 3] for a in r}
        assert window == {("sim", i) for i in range(2, 7)}, (start, rounds[start:start + 3])


def test_reconnect_period_grows_like_memberlists_push_pull_scale() -> None:
    config = SwimConfig(reconnect_interval_s=1.0)
    assert [reconnect_period_s(config, n) for n in (2, 32, 33, 64, 65, 1000)] == [
        1.0, 1.0, 2.0, 2.0, 3.0, 6.0]


def test_reconnect_gives_up_after_the_reconnect_timeout() -> None:
    config = SwimConfig(reconnect_interval_s=10.0, reconnect_timeout_s=55.0,
                        push_pull_interval_s=1e9)
    core = _core(3, config)
    core.handle(Gossip(NodeId(3), (DeadUpdate(NodeId(2), 0, NodeId(3)),
                                   DeadUpdate(NodeId(3), 0, NodeId(3)))), ("sim", 3), 1.0)
    times: list[float] = []
    now = 1.0
    while now < 200.0:
        if any(isinstance(o.message, Sync) and o.address == ("sim", 2)
               for o in core.tick(now)):
            times.append(now)
        now += 0.1
    assert times and max(times) <= 1.0 + 55.0 + 10.0
    assert len(times) == 5  # at 10, 20, 30, 40, 50 s; the 60 s round finds it expired
