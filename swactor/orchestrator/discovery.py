"""Find the pool by SWIM: join through seeds, wait for N available stage nodes.

Theory of operation. The orchestrator joins SWIM as a member with role "orchestrator"
(its own `MembershipNode` thread; events come to the event loop through
`asyncio_events`). It keeps the latest state and metadata of every member and chooses
the candidate pool: the first `count` members by node id that are Alive, have role
"node", report `BootHealth.Available` and publish a QUIC endpoint. With a pinned pool
(`admission`, the operator's pool file: `swactor.membership.admission`) the participant
admits only the file's keys to its view (`allowed_keys`) and a candidate must also be
one of the file's `node` entries, so neither a stranger nor the orchestrator itself is
ever chosen, however small its id; without one (an explicit open pool) any member
qualifies. Whether that pool is
ready is the generated `pool_readiness` machine's decision (spec §9, bound by
`swactor.membership.pool.PoolReadiness`): every candidate complete and the view stable
for the convergence window `settle_s`, so a node that is still joining or flapping is
not planned on. A different choice (a member came or went) starts a fresh gate for the
new candidates. The members are returned in node-id order (the stage order) with their
QUIC addresses, as a `Pool`: while the run lasts, `Pool.watch` commits the run to the
gate and feeds it SWIM's events; the gate's MembershipLost (a candidate dead, left or
unavailable; a suspicion alone is not a loss) becomes the run's `MembershipLost`. The
caller stops the membership node when the run is over. Timing out raises
`DiscoveryError` naming how many nodes were found. With an `emitter`, the gate's
PoolReady is the run's `pool_ready` lifecycle event (the session then does not emit
its own). `PoolDiscovery` binds the participant at construction, so its address can
seed nodes started afterwards (`swactor run`); `discover_pool` is the one-call form.

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
(both default to `TransportConfig.idle_timeout`). With the defaults (tuned for small
pools, `swactor.membership.config`) the bound is 6.55 s up to 9 members, 7.35 s at 10
and about 17 s at the member table's limit (1024), against 30 s; with memberlist's LAN
values (`MEMBERLIST_LAN`) it is 28.3 s and passes 30 s from 11 members. A StreamFault
that still comes first waits out the run's settle window (`RunTimeouts.fault_settle_s`),
a quarter of a second more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from swactor.events.emitter import Emitter
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import pool_readiness as pr
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
from swactor.membership.admission import Admission, swim_allow_list
from swactor.membership.pool import MembershipLost as LostMember
from swactor.membership.pool import PoolReadiness, PoolReadyReached
from swactor.orchestrator.run import RunHandle
from swactor.orchestrator.session import PoolMember
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId, RunId

log = logging.getLogger("swactor.orchestrator.discovery")

DEFAULT_SETTLE_S = 1.0
_QUIET = Emitter("discovery")
"""Where the gate's pool_ready goes when no emitter is given (nowhere)."""
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
    """The discovered pool: its members, its readiness gate and the running membership
    node."""

    members: tuple[PoolMember, ...]
    node: MembershipNode
    events: asyncio.Queue[MembershipEvent]
    readiness: PoolReadiness
    run_id: RunId | None = None
    """The run whose plan was committed to the gate (by `watch`)."""

    async def watch(self, handle: RunHandle) -> None:
        """Commit the run's plan to the readiness gate, then feed it membership events:
        its MembershipLost (a chosen node dead, left or unavailable; `pool_readiness`
        decides, a suspicion alone is not a loss) becomes the run's (§9)."""
        readiness, self.run_id = self.readiness, handle.run_id
        readiness.plan_committed(handle.run_id, time.monotonic())
        while readiness.state is pr.State.Committed:
            event = await self.events.get()
            readiness.observe(event, time.monotonic())
            for outcome in readiness.take_outcomes():
                if isinstance(outcome, LostMember):
                    handle.tell(orun.MembershipLost(outcome.node_id))

    async def stop(self) -> None:
        if self.run_id is not None and self.readiness.state is pr.State.Committed:
            self.readiness.run_ended(self.run_id, time.monotonic())
        await asyncio.to_thread(self.node.stop, True)


class PoolDiscovery:
    """The orchestrator's SWIM participant, bound at construction (its `address` can be
    handed to nodes as their seed before they start), and `wait()` for the pool."""

    def __init__(
        self,
        identity: NodeIdentity,
        swim_bind: tuple[str, int],
        seeds: tuple[tuple[str, int], ...],
        count: int,
        *,
        admission: Admission | None = None,
        settle_s: float = DEFAULT_SETTLE_S,
        swim: SwimConfig = DEFAULT_SWIM,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        warn: Callable[[str], None] = log.warning,
        emitter: Emitter | None = None,
    ) -> None:
        if admission is not None and len(admission.stage_ids) < count:
            raise DiscoveryError(f"pool: {count} nodes asked for, but the pool file "
                                 f"{admission.source} pins only {len(admission.stage_ids)}")
        self.identity, self.count, self.admission = identity, count, admission
        self.settle_s, self.swim, self.idle_timeout_s = settle_s, swim, idle_timeout_s
        self.warn, self.emitter = warn, emitter
        _warn_fault_order(swim, count + 1, idle_timeout_s, warn)
        self.queue: asyncio.Queue[MembershipEvent] = asyncio.Queue()
        meta = MemberMeta(swim_host=swim_bind[0], swim_port=0, role="orchestrator")
        self.node = MembershipNode(identity, swim, meta, seeds=list(seeds), bind=swim_bind,
                                   allowed_keys=swim_allow_list(admission),
                                   on_event=asyncio_events(asyncio.get_running_loop(),
                                                           self.queue))
        self._started = False

    def start(self) -> None:
        """Start the participant (answering joins; its events queue up for `wait`)."""
        if not self._started:
            self._started = True
            self.node.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound SWIM address (a seed for the pool's nodes)."""
        return self.node.address

    def _admitted(self, node: NodeId, change: MemberChanged) -> bool:
        """A stage candidate: usable, and pinned as a `node` when the pool is pinned."""
        return (_usable(change.state, change.meta)
                and (self.admission is None or node in self.admission.stage_ids))

    async def wait(self, timeout_s: float = 120.0) -> Pool:
        """The first `count` admitted usable nodes by id once `pool_readiness` reports
        PoolReady (module doc); DiscoveryError after `timeout_s`."""
        count, queue, swim = self.count, self.queue, self.swim
        node = self.node
        self.start()
        me = NodeId(self.identity.node_id)
        known: dict[NodeId, MemberChanged] = {}
        readiness: PoolReadiness | None = None
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                now = time.monotonic()
                if now > deadline:
                    usable = sum(1 for n, e in known.items() if self._admitted(n, e))
                    raise DiscoveryError(f"pool: {min(usable, count)} of {count} nodes "
                                         f"available after {timeout_s:.0f}s")
                wake = min(deadline, readiness.next_deadline() if readiness else deadline,
                           now + 0.1)
                event: MembershipEvent | None = None
                with contextlib.suppress(TimeoutError):
                    event = await asyncio.wait_for(queue.get(), max(0.0, wake - now))
                now = time.monotonic()
                if isinstance(event, MemberChanged):
                    previous = known.get(event.node_id)
                    known[event.node_id] = replace(
                        event, meta=event.meta or (previous.meta if previous else None))
                chosen = sorted(n for n, e in known.items() if self._admitted(n, e))[:count]
                if len(chosen) == count and (readiness is None
                                             or readiness.candidates != frozenset(chosen)):
                    # a new candidate pool: its gate starts from what is known of each
                    readiness = PoolReadiness(chosen, self.settle_s, observer=me,
                                              emitter=self.emitter or _QUIET)
                    for change in known.values():
                        readiness.observe(change, now)
                elif readiness is not None and event is not None:
                    readiness.observe(event, now)
                if readiness is None:
                    continue
                readiness.tick(now)
                if any(isinstance(o, PoolReadyReached) for o in readiness.take_outcomes()):
                    live = sum(1 for e in known.values()
                               if e.state in (MemberState.Alive, MemberState.Suspect))
                    _warn_fault_order(swim, live + 1, self.idle_timeout_s, self.warn)
                    break
        except BaseException:
            await asyncio.to_thread(node.stop, True)
            raise
        members = []
        for node_id in sorted(readiness.candidates):
            found = known[node_id].meta
            assert found is not None
            members.append(PoolMember(node_id, found.quic_host, found.quic_port))
        return Pool(tuple(members), node, queue, readiness)

    async def close(self) -> None:
        """Stop the participant (when `wait` was never called or did not return a Pool)."""
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
    admission: Admission | None = None,
    emitter: Emitter | None = None,
) -> Pool:
    """The first `count` admitted usable nodes by id, with the running membership node.

    `warn` gets the FaultOrderError's text, before joining or once found, when SWIM is
    not the faster failure detector (module doc, Fault order). With `emitter`, the
    `pool_readiness` machine's pool_ready goes there (else nowhere)."""
    discovery = PoolDiscovery(identity, swim_bind, seeds, count, admission=admission,
                              settle_s=settle_s, swim=swim, idle_timeout_s=idle_timeout_s,
                              warn=warn, emitter=emitter)
    return await discovery.wait(timeout_s)
