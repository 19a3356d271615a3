"""SWIM failure detection in simulation, next to the SWIM paper's expectations.

Theory of operation: for each pool size N (10, 100, 1000) and a few seeds, a
`swactor.testing.swim_sim.Simulation` runs the default configuration (0.5 s probe
period, 250 ms probe timeout, 3 indirect probes, gossip 200 ms x 3, Lifeguard
suspicion; `--memberlist`: memberlist's LAN values, 1 s / 500 ms) on a
loss-free simulated network in simulated time, so every figure is in real seconds of
protocol time, independent of this machine's speed. After a warm-up one member is
crashed; the run records when the first member suspects it, when the first and the last
member declare it dead, and the messages every member sends per second, both in the
steady state before the crash and during detection.

Printed side by side with the SWIM paper (Das, Gupta, Motivala 2002):
* first detection: expected e/(e-1) ~ 1.58 protocol periods until some member probes
  the failed one (measured: the first Ping sent to it; the suspicion follows when that
  probe's period ends);
* per-member load: constant in N (one ping sent and, on average, one ack sent per
  period: ~2 messages/member/s at a 1 s period);
* dissemination: O(log N) periods, shown as (last dead - first dead) beside log2 N
  gossip rounds; memberlist's detection bound (`detection_bound_s`) is printed too.
Wall-clock cost of the simulation itself is printed in the last column; then the cost
of the signed wire format per datagram (Ed25519 sign / verify) beside plain JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import timeit

from swactor.membership.config import (
    MEMBERLIST_LAN,
    SwimConfig,
    detection_bound_s,
    suspicion_max_s,
    suspicion_min_s,
)
from swactor.membership.messages import AliveUpdate, BootHealth, MemberMeta, MemberState, Ping
from swactor.membership.wire import Codec, Signer
from swactor.testing.swim_sim import Simulation, sim_node_id
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

WARMUP_S = 8.0
STEADY_FROM_S = 3.0


def _trial(members: int, seed: int, config: SwimConfig) -> dict[str, float]:
    sim = Simulation(members, seed=seed, config=config)
    sim.run_until(STEADY_FROM_S)
    sent_before = sim.messages_sent()
    sim.run_until(WARMUP_S)
    steady = (sim.messages_sent() - sent_before) / members / (WARMUP_S - STEADY_FROM_S)
    victim = sim.rng.randrange(members)
    target = sim_node_id(victim)
    sim.crash(victim)
    crashed_at = sim.now
    sent_at_crash = sim.messages_sent()
    observers = [i for i in range(members) if i != victim]
    limit = crashed_at + 3 * detection_bound_s(config, members)
    while sim.now < limit:
        sim.run_until(sim.now + 0.25)
        if all(sim.first_state_time(o, target, MemberState.Dead) is not None for o in observers):
            break
    dead = [sim.first_state_time(o, target, MemberState.Dead) for o in observers]
    if any(t is None for t in dead):
        raise RuntimeError(f"N={members} seed={seed}: not every member declared the crash")
    suspect = [sim.first_state_time(o, target, MemberState.Suspect) for o in observers]
    first_suspect = min(t for t in suspect if t is not None) - crashed_at
    times = [t - crashed_at for t in dead if t is not None]
    detect_window = max(times)
    during = (sim.messages_sent() - sent_at_crash) / (members - 1) / detect_window
    first_probe = sim.first_probe_of_crashed[victim] - crashed_at
    return {"first_probe": first_probe, "first_suspect": first_suspect,
            "first_dead": min(times), "all_dead": max(times), "steady": steady, "during": during}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench swim")
    parser.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--trials", type=int, default=0, help="seeds per size (0: 9/5/3)")
    parser.add_argument("--memberlist", action="store_true",
                        help="memberlist's LAN values instead of the defaults")
    args = parser.parse_args(argv)
    config = MEMBERLIST_LAN if args.memberlist else SwimConfig()
    period = config.probe_interval_s
    name = "memberlist LAN values" if args.memberlist else "defaults"
    print(f"{name}: probe {period}s / timeout {config.probe_timeout_s}s, "
          f"{config.indirect_checks} indirect, gossip {config.gossip_interval_s}s x "
          f"{config.gossip_nodes}; no message loss; times in protocol seconds (medians)")
    header = (f"{'N':>5} {'trials':>6} | {'1st probe':>9} {'paper':>6} {'1st suspect':>11} | "
              f"{'1st dead':>8} {'all dead':>8} {'spread':>6} {'log2N rnds':>10} "
              f"{'bound':>6} | {'susp min..max':>13} | {'msg/m/s steady':>14} "
              f"{'during':>6} {'paper':>5} | {'wall s':>6}")
    print(header)
    print("-" * len(header))
    for members in args.sizes:
        trials = args.trials or (9 if members <= 10 else 5 if members <= 100 else 3)
        started = time.perf_counter()
        rows = [_trial(members, 1000 * members + seed, config) for seed in range(trials)]
        wall = time.perf_counter() - started
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        rounds = math.log2(members) * config.gossip_interval_s
        print(f"{members:>5} {trials:>6} | {med['first_probe'] / period:>7.2f}pp "
              f"{math.e / (math.e - 1):>4.2f}pp {med['first_suspect'] / period:>9.2f}pp | "
              f"{med['first_dead']:>7.2f}s "
              f"{med['all_dead']:>7.2f}s {med['all_dead'] - med['first_dead']:>5.2f}s "
              f"{rounds:>9.2f}s {detection_bound_s(config, members):>5.1f}s | "
              f"{suspicion_min_s(config, members):>5.1f}..{suspicion_max_s(config, members):>5.1f}s"
              f" | {med['steady']:>14.2f} {med['during']:>6.2f} {2.0 / period:>5.1f} | "
              f"{wall:>6.1f}")
    print("pp = protocol periods. 1st probe: first ping to the crashed member; paper: its "
          "expectation e/(e-1); the suspicion follows when that probe's period ends.")
    print("spread = all dead - first dead (dissemination); log2N rnds = log2(N) gossip "
          "intervals, the epidemic's O(log N).")
    _wire_costs()
    return 0


def _wire_costs() -> None:
    """Per-datagram cost of the signed wire format, beside an unsigned JSON baseline."""
    alice, bob = NodeIdentity.generate(), NodeIdentity.generate()
    a = NodeId(alice.node_id)
    tx, rx = Codec(Signer(alice.private_key)), Codec(Signer(bob.private_key))
    meta = MemberMeta("10.0.0.1", 7946, "10.0.0.1", 4433, BootHealth.Available, "cuda", 1 << 34)
    alive = AliveUpdate(a, 1, meta)
    bare = Ping(a, 1, NodeId(bob.node_id))
    loaded = Ping(a, 2, NodeId(bob.node_id), (alive,))
    b = NodeId(bob.node_id)
    (bare_dgram,) = tx.encode(bare, b)
    (loaded_dgram,) = tx.encode(loaded, b)
    rx.decode(loaded_dgram, ("10.0.0.1", 7946), 0.0)  # the update's signature is now cached
    body = {"t": "ping", "s": int(a), "q": 1, "tg": bob.node_id, "u": []}
    number = 2000
    # every datagram is fresh: the receiver refuses one it has seen (replay window)
    bares = iter([tx.encode(bare, b)[0] for _ in range(number)])
    loadeds = iter([tx.encode(loaded, b)[0] for _ in range(number)])
    figures = {
        "encode ping (sign)": timeit.timeit(lambda: tx.encode(bare, b), number=number),
        "decode ping (verify)": timeit.timeit(
            lambda: rx.decode(next(bares), ("10.0.0.1", 7946), 0.0), number=number),
        "decode ping + cached alive": timeit.timeit(
            lambda: rx.decode(next(loadeds), ("10.0.0.1", 7946), 0.0), number=number),
        "json dumps+loads (baseline)": timeit.timeit(
            lambda: json.loads(json.dumps(body)), number=number),
    }
    baseline = figures["json dumps+loads (baseline)"]
    print(f"wire: ping {len(bare_dgram)} B, with one alive update {len(loaded_dgram)} B")
    for name, seconds in figures.items():
        print(f"  {name:<28} {seconds / number * 1e6:8.1f} us  ({seconds / baseline:5.1f}x json)")
    print("  at 2 msg/member/s (steady state) a member signs 2 and verifies 2 datagrams a "
          "second: well under 1 ms of CPU per second.")
