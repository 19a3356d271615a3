"""Find the pool by SWIM: join through seeds, wait for N available stage nodes.

Theory of operation. The orchestrator joins SWIM as a member with role "orchestrator"
(its own `MembershipNode` thread; events come to the event loop through
`asyncio_events`). It keeps the latest metadata of every member; the pool is ready when
`count` members are Alive, have role "node", report `BootHealth.Available` and publish
a QUIC endpoint, and that set has not changed for `settle_s` (so a node that is still
joining or flapping is not planned on). The members are returned in node-id order (the
stage order) with their QUIC addresses, as a `Pool`: while the run lasts, `Pool.watch`
turns a chosen node that SWIM declares dead or gone into the run's `MembershipLost`;
the caller stops the membership node when the run is over. Timing out raises
`DiscoveryError` naming how many nodes were found.

Fault order (spec §36, first run-level failure). A node cut off mid-run is seen twice: by
SWIM (it stops answering probes and is declared dead: MembershipLost, the root cause) and
by its peers' QUIC edges, which report a StreamFault once the connection's idle timeout
passes (a symptom). The orchestrator records the first, so SWIM should be the faster:
`check_fault_order` raises FaultOrderError for a SWIM configuration whose detection
bound (`swactor.membership.detection_bound_s`, for the members in the view) is not below
the QUIC idle timeout. `discover_pool` runs it before joining (for the pool asked for)
and again once the pool is found (for the whole view) and passes the error's text to
`warn` (the command prints it): the run is still fail-stop, only a cut-off node may be
recorded as its peers' StreamFault instead of MembershipLost, so a large pool is warned,
not refused. The nodes are assumed to run the orchestrator's transport idle timeout
(both default to `TransportConfig.idle_timeout`). With the defaults the bound is 28.3 s
(29.1 s at 10 members, over 30 s from 11) against 30 s; a StreamFault that still comes
first waits out the run's settle window (`RunTimeouts.fault_settle_s`), one more second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from swactor.fsm.generated import orchestrator_run as orun
from swactor.membership import (
    BootHealth,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MembershipNode,
    MemberState,
    SwimConfig,
    asyncio_events,
    detection_bound_s,
)
from swactor.orchestrator.run import RunHandle
from swactor.orchestrator.session import PoolMember
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

log = logging.getLogger("swactor.orchestrator.discovery")

DEFAULT_SETTLE_S = 1.0
DEFAULT_SWIM = SwimConfig()
DEFAULT_IDLE_TIMEOUT_S = TransportConfig().idle_timeout


class DiscoveryError(Exception):
    """The pool did not become ready; the message says what was found."""


class FaultOrderError(DiscoveryError):
    """SWIM would declare a cut-off node dead only after QUIC's idle timeout (module doc)."""


def check_fault_order(swim: SwimConfig, members: int, idle_timeout_s: float) -> float:
    """The SWIM detection bound for `members`; FaultOrderError unless below the idle timeout."""
    bound = detection_bound_s(swim, members)
    if bound >= idle_timeout_s:
        raise FaultOrderError(
            f"SWIM detection bound {bound:.1f}s for {members} members is not below the QUIC "
            f"idle timeout {idle_timeout_s:.1f}s: a cut-off node would be reported as its "
            "peers' StreamFault instead of MembershipLost (shorten SWIM's probe interval or "
            "suspicion, or lengthen the idle timeout)")
    return bound


def _warn_fault_order(swim: SwimConfig, members: int, idle_timeout_s: float,
                      warn: Callable[[str], None]) -> None:
    try:
        check_fault_order(swim, members, idle_timeout_s)
    except FaultOrderError as error:
        warn(str(error))


def _usable(state: MemberState, meta: MemberMeta | None) -> bool:
    return (state is MemberState.Alive and meta is not None and meta.role == "node"
            and meta.boot_health is BootHealth.Available and meta.has_endpoint)


@dataclass
class Pool:
    """The discovered pool: its members and the running membership node."""

    members: tuple[PoolMember, ...]
    node: MembershipNode
    events: asyncio.Queue[MembershipEvent]

    async def watch(self, handle: RunHandle) -> None:
        """Tell the run `MembershipLost` when one of its nodes is dead or left (§9).

        Suspicion alone is not a loss: SWIM suspects a slow member and refutes it."""
        wanted = {m.node_id for m in self.members}
        while True:
            event = await self.events.get()
            if isinstance(event, MemberChanged) and event.node_id in wanted \
                    and event.state in (MemberState.Dead, MemberState.Left):
                wanted.discard(event.node_id)
                handle.tell(orun.MembershipLost(event.node_id))

    async def stop(self) -> None:
        await asyncio.to_thread(self.node.stop, True)


async def discover_pool(
    identity: NodeIdentity,
    swim_bind: tuple[str, int],
    seeds: tuple[tuple[str, int], ...],
    count: int,
    timeout_s: float = 120.0,
    settle_s: float = DEFAULT_SETTLE_S,
    swim: SwimConfig = DEFAULT_SWIM,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    warn: Callable[[str], None] = log.warning,
) -> Pool:
    """The first `count` usable nodes by id, with the running membership node.

    `warn` gets the FaultOrderError's text, before joining or once found, when SWIM is
    not the faster failure detector (module doc, Fault order)."""
    _warn_fault_order(swim, count + 1, idle_timeout_s, warn)
    queue: asyncio.Queue[MembershipEvent] = asyncio.Queue()
    meta = MemberMeta(swim_host=swim_bind[0], swim_port=0, role="orchestrator")
    node = MembershipNode(identity, swim, meta, seeds=list(seeds), bind=swim_bind,
                          on_event=asyncio_events(asyncio.get_running_loop(), queue))
    node.start()
    known: dict[NodeId, tuple[MemberState, MemberMeta | None]] = {}
    deadline = time.monotonic() + timeout_s
    stable_since: float | None = None
    chosen: tuple[NodeId, ...] = ()
    try:
        while True:
            now = time.monotonic()
            if now > deadline:
                raise DiscoveryError(f"pool: {len(chosen)} of {count} nodes available after "
                                     f"{timeout_s:.0f}s")
            with contextlib.suppress(TimeoutError):
                event = await asyncio.wait_for(queue.get(), 0.1)
                if isinstance(event, MemberChanged):
                    previous = known.get(event.node_id, (event.state, None))[1]
                    known[event.node_id] = (event.state, event.meta or previous)
            usable = tuple(sorted(n for n, (state, m) in known.items() if _usable(state, m)))
            if usable != chosen:
                chosen, stable_since = usable, time.monotonic()
            if len(chosen) >= count and stable_since is not None \
                    and time.monotonic() - stable_since >= settle_s:
                live = sum(1 for state, _ in known.values()
                           if state in (MemberState.Alive, MemberState.Suspect))
                _warn_fault_order(swim, live + 1, idle_timeout_s, warn)
                break
    except BaseException:
        await asyncio.to_thread(node.stop, True)
        raise
    members = []
    for node_id in chosen[:count]:
        found = known[node_id][1]
        assert found is not None
        members.append(PoolMember(node_id, found.quic_host, found.quic_port))
    return Pool(tuple(members), node, queue)
