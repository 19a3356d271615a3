"""Membership (spec §8-§9): SWIM with Lifeguard, signed updates, PoolReady, node boot.

Theory of operation
-------------------
* `core.SwimCore` is one SWIM participant, sans-I/O: messages and time in, messages and
  membership events out; each remote member's state is the generated `swim_member`
  machine. `config` holds memberlist's parameters and timing formulas. A partition
  heals by itself once the link is back: members declared dead are sent a full-state
  sync every reconnect interval (Serf's reconnect), which makes both sides refute.
* `sim.Simulation` runs many cores on a seeded simulated network (tests, benchmark).
* `wire` signs and verifies datagrams and updates with the node's Ed25519 identity
  key; `udp.MembershipNode` runs a core on its own UDP port in its own thread.
* `pool.PoolReadiness` binds the generated `pool_readiness` machine (orchestrator side);
  `boot.NodeBoot` binds `node_boot` (node side) and `boot.SwimJoin` is its join step.

Usage (a node publishing its endpoint; the orchestrator waiting for PoolReady)::

    node = MembershipNode(identity, SwimConfig(), MemberMeta("10.0.0.5", 0, "10.0.0.5",
                          4433, BootHealth.Booting, "cuda", 80 << 30),
                          seeds=[("10.0.0.1", 7946)], bind=("0.0.0.0", 7946))
    node.start()                       # own thread; node.update_meta(...) when available

    queue: asyncio.Queue[MembershipEvent] = asyncio.Queue()
    orch = MembershipNode(orch_identity, SwimConfig(), MemberMeta("10.0.0.1", 0,
                          role="orchestrator"), bind=("0.0.0.0", 7946),
                          on_event=asyncio_events(asyncio.get_running_loop(), queue))
    orch.start()
    readiness = PoolReadiness(candidate_ids, convergence_window_s=3.0,
                              observer=orch.node_id)
    await wait_pool_ready(queue, readiness, timeout_s=60)   # emits pool_ready
"""

from swactor.membership.boot import BootSteps, NodeBoot, SwimJoin
from swactor.membership.config import SwimConfig, detection_bound_s
from swactor.membership.core import MemberView, SwimCore
from swactor.membership.messages import (
    BootHealth,
    ForgedMessage,
    ForgeryReason,
    Joined,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MemberState,
    RefusalReason,
    Refused,
    Refuted,
)
from swactor.membership.pool import (
    MembershipLost,
    Outcome,
    PoolReadiness,
    PoolReadyReached,
    ReadinessLost,
    WaitingAborted,
    wait_pool_ready,
)
from swactor.membership.udp import MembershipNode, asyncio_events
from swactor.membership.wire import MembershipWireError, public_key_raw

__all__ = [
    "BootHealth",
    "BootSteps",
    "ForgedMessage",
    "ForgeryReason",
    "Joined",
    "MemberChanged",
    "MemberMeta",
    "MemberState",
    "MemberView",
    "MembershipEvent",
    "MembershipLost",
    "MembershipNode",
    "MembershipWireError",
    "NodeBoot",
    "Outcome",
    "PoolReadiness",
    "PoolReadyReached",
    "ReadinessLost",
    "RefusalReason",
    "Refused",
    "Refuted",
    "SwimConfig",
    "SwimCore",
    "SwimJoin",
    "WaitingAborted",
    "asyncio_events",
    "detection_bound_s",
    "public_key_raw",
    "wait_pool_ready",
]
