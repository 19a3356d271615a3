"""SWIM/Lifeguard parameters and the timing formulas memberlist uses.

Theory of operation
-------------------
`SwimConfig`'s defaults are memberlist's LAN configuration tuned for the small pools
swactor runs (a few stage nodes and an orchestrator): probe every 0.5 s with a 250 ms
probe timeout (memberlist: 1 s and 500 ms) and a maximum suspicion of 2x the minimum
(memberlist: 6x); the rest is memberlist's (3 indirect probes, gossip every 200 ms to 3
members, suspicion multiplier 4, retransmit multiplier 4, local health awareness up to
8x, push/pull every 30 s) and Serf's reconnect defaults (a member declared dead is
retried every 30 s for 24 h). `MEMBERLIST_LAN` keeps memberlist's own values. Tests
scale a configuration down through `scaled()`.

Why these values. A run is fail-stop, so a stage host that falls silent (pulled cable,
powered off, process killed) must be declared dead long before the QUIC idle timeout
(30 s) would end its peers' edges. With memberlist's values the bound below is 28.3 s
for 4 members; with these it is 6.55 s (measured in simulation: median 2.8 s, worst
3.4 s over 40 seeds at 4 members). The price is a smaller tolerance for a member that
stalls (a stopped process, a starved thread): in simulation, with 5% message loss, a
member paused for 2 s was never declared dead, one paused for 3 s usually was
(`tests/membership/test_simulation.py`), and in a pool of 50 under 10% message loss a
healthy member can be declared dead (its refutation loses the race against the 3.4 s
minimum suspicion); up to 10 members, 10% loss killed no healthy member. A large or
lossy pool wants `MEMBERLIST_LAN`'s margins. Probing twice as often costs about 4
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
    reconnect_interval_s: float = 30.0
    """Every this often, a full-state sync with one member believed dead (partition heal)."""
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


def detection_bound_s(config: SwimConfig, members: int) -> float:
    """The time by which every member should have declared a crashed member dead."""
    first_suspicion = 3 * config.probe_interval_s + config.probe_timeout_s
    dissemination = retransmit_limit(config, members) * config.gossip_interval_s
    return first_suspicion + suspicion_max_s(config, members) + dissemination
