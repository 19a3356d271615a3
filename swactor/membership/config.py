"""SWIM/Lifeguard parameters and the timing formulas memberlist uses.

Theory of operation
-------------------
`SwimConfig`'s defaults are memberlist's LAN configuration tuned for the small pools
swactor runs (a few stage nodes and an orchestrator): probe every 0.5 s with a 250 ms
probe timeout (memberlist: 1 s and 500 ms) and a maximum suspicion of 2x the minimum
(memberlist: 6x); the rest is memberlist's (3 indirect probes, gossip every 200 ms to 3
members, suspicion multiplier 4, retransmit multiplier 4, local health awareness up to
8x, push/pull every 30 s) and Serf's reconnect timeout (a member declared dead stays a
reconnect target for 24 h). `MEMBERLIST_LAN` keeps memberlist's own values. Tests scale
a configuration down through `scaled()`.

Why these values. A run is fail-stop, so a stage host that falls silent (pulled cable,
powered off, process killed) must be declared dead long before the QUIC idle timeout
(30 s) would end its peers' edges. With memberlist's values the bound below is 28.3 s
for 4 members; with these it is 6.55 s (measured in simulation: median 2.8 s, worst
3.4 s over 40 seeds at 4 members). The price is a smaller tolerance for a member that
stalls (a stopped process, a starved thread): in simulation, with 5% message loss, a
member paused for 2 s was never declared dead, one paused for 3 s usually was
(`tests/membership/test_simulation.py`), and in a pool of 50 under 10% message loss a
healthy member can be declared dead (its refutation loses the race against the 3.4 s
minimum suspicion); under 10% loss while another member was paused for 20 s, no healthy
member died in 40 seeded runs at 4 members, but one did in 5 of 40 at 10 members. A
large or lossy pool wants `MEMBERLIST_LAN`'s margins. Probing twice as often costs about 4
datagrams per member per second instead of 2.

The formulas are memberlist's:

* suspicion timeout (minimum) = suspicion_mult * max(1, log10(N)) * probe_interval;
  the maximum is suspicion_max_mult times that. Lifeguard starts a suspicion at the
  maximum and shrinks it toward the minimum with each independent confirmation:
  timeout(c) = max(min, max - (max - min) * log(c + 1) / log(k + 1)), where k =
  suspicion_mult - 2 confirmations are expected (0 when the pool is too small);
* an update is retransmitted retransmit_mult * ceil(log10(N + 1)) times.

`detection_bound_s` is the bound the tests and benchmark hold a failure detection to:

    bound(N) = 3 * probe_interval + probe_timeout                 (first suspicion)
             + suspicion_max_mult * suspicion_mult * max(1, log10 N) * probe_interval
             + retransmit_mult * ceil(log10(N + 1)) * gossip_interval  (dissemination)

three probe periods for the first suspicion (a member escapes every probe for k periods
with probability about e^-k), plus the probe timeout, plus the maximum suspicion timeout
(every member runs its own suspicion timer), plus the gossip rounds needed to spread the
suspicion (retransmit limit gossip intervals). With the defaults: 6.55 s for 2 to 9
members, 7.35 s for 10, about 17 s for 1000.

Rejoin after a partition heals. Both sides of a cut declare each other dead, and SWIM
never probes a dead member again; what re-merges the views is the reconnect sync (a
full-state `Sync` to members declared dead, `core`). Serf retries one random dead member
every 30 s, so a healed link went unnoticed for up to a minute or more (a cut-off member
with two dead peers and a seed to choose from). Here each reconnect round syncs with
`reconnect_nodes` dead members in round-robin order, every `reconnect_interval_s`
(1 s) scaled like memberlist's push/pull interval (`reconnect_period_s`: unchanged up to
32 members, then +1x per doubling), so each dead member is synced at least every
ceil(F / reconnect_nodes) periods with F members held dead. `heal_bound_s` is the bound
the tests hold a heal to:

    heal(N, F) = ceil(F / reconnect_nodes) * reconnect_period(N)   (the first sync)
               + 2 * probe_interval                              (latency, refutation)
               + retransmit_mult * ceil(log10(N + 1)) * gossip_interval  (dissemination)

2.8 s for a pool of 2 to 9 members with up to 3 held dead (measured in simulation:
~1.1 s; `tests/membership/test_partition.py`). The price is traffic to members that
are really gone: each member sends at most `reconnect_nodes` full-view `Sync`s per
reconnect period, however many members it holds dead, for the reconnect timeout; for
the small pools this tuning targets that is a few hundred bytes a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SwimConfig:
    """Protocol parameters (seconds unless named otherwise)."""

    probe_interval_s: float = 0.5
    probe_timeout_s: float = 0.25
    indirect_checks: int = 3
    gossip_interval_s: float = 0.2
    gossip_nodes: int = 3
    suspicion_mult: int = 4
    suspicion_max_mult: int = 2
    retransmit_mult: int = 4
    awareness_max_multiplier: int = 8
    gossip_to_the_dead_s: float = 30.0
    dead_retention_s: float = 60.0
    push_pull_interval_s: float = 30.0
    reconnect_interval_s: float = 1.0
    """Every this often (scaled by `reconnect_period_s` for large pools), a full-state sync
    with `reconnect_nodes` members declared dead, round robin (partition heal)."""
    reconnect_nodes: int = 3
    """Members declared dead that one reconnect round syncs with."""
    reconnect_timeout_s: float = 86400.0
    """How long a member declared dead stays a reconnect target (kept past its reaping)."""
    join_retry_s: float = 1.0
    max_piggyback: int = 6
    max_members: int = 1024
    """Members the table holds at most (any state); a new member beyond it is refused."""
    max_relays: int = 64
    """Indirect probes (PingReq) run for others at once; more are refused."""

    def __post_init__(self) -> None:
        positive = {
            "probe_interval_s": self.probe_interval_s,
            "probe_timeout_s": self.probe_timeout_s,
            "gossip_interval_s": self.gossip_interval_s,
            "join_retry_s": self.join_retry_s,
            "reconnect_interval_s": self.reconnect_interval_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"SwimConfig.{name} must be > 0, got {value}")
        if self.probe_timeout_s >= self.probe_interval_s:
            raise ValueError("SwimConfig.probe_timeout_s must be below probe_interval_s")
        counts = {
            "indirect_checks": self.indirect_checks,
            "gossip_nodes": self.gossip_nodes,
            "suspicion_mult": self.suspicion_mult,
            "suspicion_max_mult": self.suspicion_max_mult,
            "retransmit_mult": self.retransmit_mult,
            "awareness_max_multiplier": self.awareness_max_multiplier,
            "max_piggyback": self.max_piggyback,
            "reconnect_nodes": self.reconnect_nodes,
            "max_members": self.max_members,
            "max_relays": self.max_relays,
        }
        for name, count in counts.items():
            if count < 1:
                raise ValueError(f"SwimConfig.{name} must be >= 1, got {count}")

    def scaled(self, factor: float) -> SwimConfig:
        """Every period and timeout multiplied by `factor` (counts unchanged)."""
        return replace(
            self,
            probe_interval_s=self.probe_interval_s * factor,
            probe_timeout_s=self.probe_timeout_s * factor,
            gossip_interval_s=self.gossip_interval_s * factor,
            gossip_to_the_dead_s=self.gossip_to_the_dead_s * factor,
            dead_retention_s=self.dead_retention_s * factor,
            push_pull_interval_s=self.push_pull_interval_s * factor,
            reconnect_interval_s=self.reconnect_interval_s * factor,
            reconnect_timeout_s=self.reconnect_timeout_s * factor,
            join_retry_s=self.join_retry_s * factor,
        )


MEMBERLIST_LAN = SwimConfig(probe_interval_s=1.0, probe_timeout_s=0.5, suspicion_max_mult=6)
"""memberlist's DefaultLANConfig values (probe 1 s / 500 ms, suspicion max 6x): the
defaults before they were tuned for small pools (module doc), kept for comparison."""


def suspicion_min_s(config: SwimConfig, members: int) -> float:
    """memberlist's suspicion timeout: suspicion_mult * max(1, log10 N) * probe interval."""
    scale = max(1.0, math.log10(max(1, members)))
    return config.suspicion_mult * scale * config.probe_interval_s


def suspicion_max_s(config: SwimConfig, members: int) -> float:
    """The timeout a suspicion starts with before any confirmation (Lifeguard)."""
    return config.suspicion_max_mult * suspicion_min_s(config, members)


def expected_confirmations(config: SwimConfig, members: int) -> int:
    """Lifeguard's k: confirmations that shrink the timeout to its minimum."""
    k = config.suspicion_mult - 2
    return 0 if members - 2 < k else k


def suspicion_timeout_s(config: SwimConfig, members: int, confirmations: int) -> float:
    """The suspicion timeout after `confirmations` independent confirmations."""
    low = suspicion_min_s(config, members)
    high = suspicion_max_s(config, members)
    k = expected_confirmations(config, members)
    if k < 1:
        return low
    frac = math.log(confirmations + 1.0) / math.log(k + 1.0)
    return max(low, high - (high - low) * frac)


def retransmit_limit(config: SwimConfig, members: int) -> int:
    """How many times one update is piggybacked: retransmit_mult * ceil(log10(N + 1))."""
    return config.retransmit_mult * math.ceil(math.log10(members + 1))


def reconnect_period_s(config: SwimConfig, members: int) -> float:
    """The reconnect interval for a pool of `members`: memberlist's pushPullScale.

    Unchanged up to 32 members, then one more interval per doubling beyond 32, so the
    reconnect traffic a pool sends grows like N log N rather than N^2.
    """
    threshold = 32
    if members <= threshold:
        return config.reconnect_interval_s
    scale = math.ceil(math.log2(members) - math.log2(threshold)) + 1
    return config.reconnect_interval_s * scale


def heal_bound_s(config: SwimConfig, members: int, held_dead: int) -> float:
    """When every view should be whole again after a partition of `members` heals.

    `held_dead`: the most members any one member holds dead at the heal (module doc).
    """
    rounds = max(1, math.ceil(held_dead / config.reconnect_nodes))
    first_sync = rounds * reconnect_period_s(config, members)
    dissemination = retransmit_limit(config, members) * config.gossip_interval_s
    return first_sync + 2 * config.probe_interval_s + dissemination


def detection_bound_s(config: SwimConfig, members: int) -> float:
    """The time by which every member should have declared a crashed member dead."""
    first_suspicion = 3 * config.probe_interval_s + config.probe_timeout_s
    dissemination = retransmit_limit(config, members) * config.gossip_interval_s
    return first_suspicion + suspicion_max_s(config, members) + dissemination
