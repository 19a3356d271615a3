"""The SWIM participant, sans-I/O: messages and time in, messages and events out.

Theory of operation
-------------------
`SwimCore` is one member's protocol state. It owns no socket, thread or clock: the
caller passes `now` (seconds on any monotonic clock) to every call, supplies the random
source, sends the `Outgoing` messages it returns, calls `tick(now)` at or after
`next_deadline()`, and drains `take_events()`. The same core runs under the UDP runner
(`swactor.membership.udp`) and the seeded simulator (`swactor.testing.swim_sim`).

What it does, following memberlist and the Lifeguard paper:

* Probing. Every probe interval (scaled by the local health multiplier) the next member
  of a shuffled round-robin order is pinged. No ack within the probe timeout: `PingReq`
  goes to `indirect_checks` other members, who ping the target themselves and relay its
  ack, or answer `Nack` when it stays silent for 80% of the timeout. No ack by the end of
  the probe period: the target becomes suspect (signed by this member).
* Local health awareness (Lifeguard LHA). A score in [0, awareness_max_multiplier - 1]
  multiplies probe interval and timeout: +1 per failed probe without nacks (+ the missed
  nacks when nacks were expected), +1 per refutation of a claim about this member, -1 per
  successful probe. A slow member therefore slows its own accusations down.
* Suspicion (Lifeguard dynamic suspicion). A suspect member gets a timer starting at the
  maximum suspicion timeout; each suspicion from a different accuser shrinks it towards
  the minimum (formulas in `config`). When it expires the member is dead.
* Refutation. A suspect or dead claim about this member at or above its incarnation makes
  it raise its incarnation past the claim and gossip alive; other members accept the
  newer alive (the swim_member table's precedence rules).
* Gossip. Accepted updates are queued (`BroadcastQueue`) and piggybacked on every probe
  message, and sent every gossip interval to `gossip_nodes` random members (recently dead
  ones included, so they can refute), each a limited number of times.
* Join and anti-entropy. `start` sends `Sync(reply=True)` with this member's alive
  update to the seeds until one answers with its own view (`Joined`); every push/pull
  interval the full view is exchanged with one random member.
* Merging a full view (memberlist's mergeRemoteState). A `Sync` carries the sender's
  whole view, stale entries included, so a dead claim in it is not taken as a verdict:
  it becomes a suspicion signed by this member, which the accused refutes in time if it
  is alive. Suspect, alive and leave entries are applied as they are.
* Partition heal (Serf's reconnect). Plain SWIM never probes a dead member again, so
  once both sides of a partition have declared each other dead nothing re-merges the
  views when the link returns. Every reconnect period (`config.reconnect_period_s`) this
  member therefore sends `Sync(reply=True)` with its full view to the next
  `reconnect_nodes` members it declared dead, round robin (kept as targets past their
  reaping, for the reconnect timeout; a member that left is not retried: only it can
  sign a leave, so a leave is never a partition artefact), and to its seeds when it has
  no live member at all. Round robin, not a random pick, so every dead member is synced
  within a bounded number of periods (`config.heal_bound_s`). If the target is up, each
  side finds the other's dead claim about itself in the exchanged view, refutes it (a
  higher incarnation, alive gossiped), and the reply already carries the refuted alive,
  so the views re-merge.

Hostile input (an authenticated but misbehaving member, or anyone in an open pool):

* A probe is answered only by its target: an `Ack` counts when both its sequence number
  and its sender match (the target, or a helper that was asked to probe it), a `Nack`
  only from a helper; sequence numbers are drawn at random, so they cannot be guessed.
* `PingReq` is served only for a sender and a target this member knows (alive or
  suspect), at the address its own view holds, at most `max_relays` at once.
* `handle(..., budget=n)` marks a datagram that was not authenticated: every answer to
  it is capped at n bytes (the wire layer fits what it can) and an indirect probe run
  for it answers once. A `Sync` answer under a budget carries a random part of the view.
* The member table holds at most `max_members` members; a new one beyond is refused.
  Only a member that once answered a probe of ours becomes a reconnect target when it
  dies, so invented members at invented addresses are reaped after `dead_retention_s`
  and never synced with for the reconnect timeout.
* Claims more than `MAX_CLAIM_AHEAD` above a member's incarnation are refused, about
  the local member too (the swim_member table's `far_ahead`), and so is a claim about
  the local member at `MAX_INCARNATION`: a refutation always stays encodable. A leave
  about the local member that it did not send is refuted.
* Refusals are `Refused` events naming the sender and the reason.

Each remote member's state is a generated `swim_member` machine
(`swactor.fsm.generated.swim_member`); `_Member` answers its guards. Updates arriving
here are already verified (the wire layer checks signatures); the simulator hands them
over as objects.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import swactor.fsm.generated.swim_member as sm
from swactor.fsm.host import MachineHost
from swactor.membership import config as cfg
from swactor.membership.broadcasts import BroadcastQueue
from swactor.membership.messages import (
    MAX_CLAIM_AHEAD,
    MAX_INCARNATION,
    MAX_SEQ,
    Ack,
    Address,
    AliveUpdate,
    DeadUpdate,
    Gossip,
    Joined,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MemberState,
    Message,
    Nack,
    Outgoing,
    Ping,
    PingReq,
    RefusalReason,
    Refused,
    Refuted,
    SuspectUpdate,
    Sync,
    Update,
)
from swactor.wire import NodeId

_STATE = {
    sm.State.Alive: MemberState.Alive,
    sm.State.Suspect: MemberState.Suspect,
    sm.State.Dead: MemberState.Dead,
    sm.State.Left: MemberState.Left,
    sm.State.Removed: MemberState.Removed,
}

_NACK_FRACTION = 0.8
"""An intermediary answers Nack when the target is silent for this part of the timeout."""


class _Member(sm.SwimMemberEffects[None]):
    """One remote member: its machine, metadata and suspicion; answers the guards and
    carries out its machine's effects on the core.

    `feed` applies one claim about the member: the update heard (None for its own
    timers), who sent it and when. The effects read them (the table's events carry
    only the incarnation; the update holds the metadata and the accuser)."""

    __slots__ = (
        "accusers",
        "changed_at",
        "confirmed",
        "core",
        "host",
        "last_update",
        "machine",
        "meta",
        "node_id",
        "now",
        "refused",
        "sender",
        "suspected_at",
        "suspicion_deadline",
        "update",
    )

    def __init__(self, core: SwimCore, update: AliveUpdate, now: float) -> None:
        self.core = core
        self.node_id = update.node_id
        self.meta = update.meta
        self.machine = sm.SwimMemberMachine(self, incarnation=update.incarnation)
        self.host = MachineHost(self.machine, sm.bind(self))
        self.last_update: Update = update
        self.changed_at = now
        self.accusers: set[NodeId] | None = None
        self.suspected_at = 0.0
        self.suspicion_deadline = 0.0
        self.confirmed = False
        """It answered one of our probes at its published address (a reconnect target)."""
        self.update: Update | None = None
        self.sender: NodeId | None = None
        self.now = now
        self.refused = False

    def feed(self, event: sm.Event, update: Update | None, sender: NodeId | None,
             now: float) -> bool:
        """Apply `event` for `update` heard from `sender` at `now`; False if refused."""
        self.update, self.sender, self.now, self.refused = update, sender, now, False
        self.host.feed(event)
        return not self.refused

    # -- effects (SwimMemberEffects) ----------------------------------------------------

    def report_alive(self, incarnation: int) -> None:
        update, core = self.update, self.core
        assert isinstance(update, AliveUpdate)
        self.meta = update.meta
        self.accusers = None
        core._add_live(self.node_id)
        core._recent_dead.pop(self.node_id, None)
        core._failed.pop(self.node_id, None)
        core._record(self, update, self.now)

    def report_suspect(self, incarnation: int) -> None:
        update = self.update
        assert isinstance(update, SuspectUpdate)
        self.accusers = {update.accuser}
        self.suspected_at = self.now
        self.core._rearm_suspicion(self, self.now)
        self.core._record(self, update, self.now)

    def confirm_suspicion(self, incarnation: int) -> None:
        update = self.update
        assert isinstance(update, SuspectUpdate)
        if self.accusers is None:
            self.accusers = set()
        if update.accuser not in self.accusers:
            self.accusers.add(update.accuser)
            self.core._rearm_suspicion(self, self.now)
            self.core._queue.push(update)

    def report_dead(self, incarnation: int) -> None:
        core = self.core
        dead = self.update if self.update is not None else DeadUpdate(
            self.node_id, self.machine.incarnation, core.node_id)
        if self.confirmed:
            core._failed.pop(self.node_id, None)
            core._failed[self.node_id] = (self.meta.swim_address, self.now)
            while len(core._failed) > core.config.max_members:
                del core._failed[next(iter(core._failed))]
        core._ended(self, dead, self.now)

    def report_left(self, incarnation: int) -> None:
        assert self.update is not None
        self.core._failed.pop(self.node_id, None)
        self.core._ended(self, self.update, self.now)

    def report_removed(self) -> None:
        core = self.core
        del core._members[self.node_id]
        core._recent_dead.pop(self.node_id, None)
        core._events.append(MemberChanged(self.node_id, MemberState.Removed,
                                          self.machine.incarnation, None, self.now))

    def refuse_claim(self, incarnation: int) -> None:
        update = self.update
        assert update is not None
        self.refused = True
        self.core._refuse(self.sender or update.author, self.node_id,
                          RefusalReason.ClaimTooFarAhead, self.now)

    # -- guards (SwimMemberGuards) ------------------------------------------------------

    def far_ahead(self, event: sm.SuspectHeard | sm.DeadHeard | sm.LeaveHeard) -> bool:
        return event.incarnation > self.machine.incarnation + MAX_CLAIM_AHEAD

    def newer(self, event: sm.AliveHeard) -> bool:
        return event.incarnation > self.machine.incarnation

    def not_older(self, event: sm.SuspectHeard | sm.DeadHeard | sm.LeaveHeard) -> bool:
        return event.incarnation >= self.machine.incarnation

    @property
    def state(self) -> MemberState:
        return _STATE[self.machine.state]

    @property
    def live(self) -> bool:
        return self.machine.state in (sm.State.Alive, sm.State.Suspect)


@dataclass(slots=True)
class _Probe:
    seq: int
    target: NodeId
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0
    helpers: frozenset[NodeId] = frozenset()


@dataclass(slots=True)
class _Relay:
    """An indirect probe this member runs for `origin`."""

    origin: NodeId
    origin_address: Address
    origin_seq: int
    target: NodeId
    nack: bool
    budget: int | None
    done: bool = False


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member as the local view holds it."""

    node_id: NodeId
    state: MemberState
    incarnation: int
    meta: MemberMeta


class SwimCore:
    """One SWIM participant (see the module docstring)."""

    def __init__(
        self,
        config: cfg.SwimConfig,
        node_id: NodeId,
        meta: MemberMeta,
        rng: random.Random,
        *,
        incarnation: int = 0,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.meta = meta
        self.incarnation = incarnation
        self.awareness = 0
        self.joined = False
        self._rng = rng
        self._seq_rng = random.Random(rng.getrandbits(64))
        self._members: dict[NodeId, _Member] = {}
        self._live: list[NodeId] = []
        self._live_index: dict[NodeId, int] = {}
        self._queue = BroadcastQueue()
        self._events: list[MembershipEvent] = []
        self._timers: list[tuple[float, int, str, int]] = []
        self._timer_seq = 0
        self._budget: int | None = None
        """While handling an unauthenticated datagram: its size (answers are capped)."""
        self._probe: _Probe | None = None
        self._probe_order: list[NodeId] = []
        self._probe_index = 0
        self._relays: dict[int, _Relay] = {}
        self._seeds: tuple[Address, ...] = ()
        self._started = False
        self._recent_dead: dict[NodeId, float] = {}
        self._failed: dict[NodeId, tuple[Address, float]] = {}
        """Members declared dead (not left): their last SWIM address and when (reconnect)."""
        self._reconnect_cursor = 0
        self._reassert = False
        self._leaving = False
        self._now = 0.0
        self.sent_messages = 0

    # ------------------------------------------------------------ public API

    def start(self, now: float, seeds: Sequence[Address] = ()) -> list[Outgoing]:
        """Begin: gossip our alive update, contact the seeds, arm the periodic timers."""
        if self._started:
            raise RuntimeError("SwimCore.start called twice")
        self._started = True
        self._now = now
        self._seeds = tuple(seeds)
        self._queue.push(self._self_alive())
        self._arm(now + self._rng.uniform(0, self.config.probe_interval_s), "probe", 0)
        self._arm(now + self._rng.uniform(0, self.config.gossip_interval_s), "gossip", 0)
        self._arm(now + self.config.push_pull_interval_s, "push_pull", 0)
        self._arm(now + self._reconnect_period(), "reconnect", 0)
        if not self._seeds:
            self.joined = True
            self._events.append(Joined(via=self.node_id, at=now))
            return []
        self._arm(now + self.config.join_retry_s, "join", 0)
        return self._join_messages()

    def handle(self, message: Message, source: Address, now: float,
               budget: int | None = None) -> list[Outgoing]:
        """Process one verified message that arrived from `source`.

        `budget`: the message came in an unauthenticated datagram of that many bytes;
        every answer to it is capped at that size.
        """
        out: list[Outgoing] = []
        self._now = now
        self._budget = budget
        if isinstance(message, Sync):
            self._merge(message.updates, now, message.sender)
        else:
            self._apply_all(message.updates, now, message.sender)
        match message:
            case Ping(sender=sender, seq=seq, target=target):
                if target == self.node_id:
                    out.append(self._send(source, Ack(self.node_id, seq), sender,
                                          budget=budget))
            case Ack(sender=sender, seq=seq):
                self._on_ack(sender, seq, now, out)
            case Nack(sender=sender, seq=seq):
                probe = self._probe
                if probe is not None and probe.seq == seq:
                    if sender in probe.helpers:
                        probe.nacks += 1
                    else:
                        self._refuse(sender, probe.target, RefusalReason.WrongResponder, now)
            case PingReq(sender=sender, seq=seq, target=target):
                self._relay(message, now, out)
            case Sync(sender=sender, reply=reply):
                if reply:
                    state = self._full_state()
                    if budget is not None:
                        rest = list(state[1:])
                        self._rng.shuffle(rest)
                        state = (state[0], *rest)
                    out.append(self._send(source, Sync(self.node_id, False), sender,
                                          updates=state, budget=budget))
                elif not self.joined:
                    self.joined = True
                    self._events.append(Joined(via=sender, at=now))
            case _:
                pass
        self._budget = None
        return out

    def tick(self, now: float) -> list[Outgoing]:
        """Run every timer due at `now`."""
        out: list[Outgoing] = []
        self._now = now
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, key = heapq.heappop(timers)
            self._fire(kind, key, now, out)
        return out

    def next_deadline(self) -> float:
        """When `tick` next has work (inf when nothing is armed). A probe's timeout
        whose probe was acked (or ended) would do nothing when it fires: it is dropped
        here, so the UDP runner does not wake up for it (twice a second per member)."""
        timers = self._timers
        while timers and timers[0][2] == "probe_timeout" and self._probe_settled(timers[0][3]):
            heapq.heappop(timers)
        return timers[0][0] if timers else float("inf")

    def _probe_settled(self, seq: int) -> bool:
        """Whether probe `seq` no longer needs its timeout (`_probe_timeout` would
        return at once): acked, or no longer the probe under way. Once true, for good."""
        probe = self._probe
        return probe is None or probe.seq != seq or probe.acked

    def take_events(self) -> list[MembershipEvent]:
        """The membership events since the last call."""
        events, self._events = self._events, []
        return events

    def update_meta(self, meta: MemberMeta, now: float) -> None:
        """Publish new metadata (boot health, endpoint): a new incarnation, gossiped."""
        if self.incarnation >= MAX_INCARNATION:
            raise OverflowError("SWIM incarnation exhausted: restart with a new key")
        self.meta = meta
        self.incarnation += 1
        self._queue.push(self._self_alive())

    def leave(self, now: float) -> list[Outgoing]:
        """Announce a graceful leave to a few members (the caller stops calling us)."""
        update = DeadUpdate(self.node_id, self.incarnation, self.node_id)
        self._leaving = True
        out: list[Outgoing] = []
        for node in self._random_members(self.config.gossip_nodes, exclude=None):
            member = self._members[node]
            out.append(self._send(member.meta.swim_address, Gossip(self.node_id), node,
                                  updates=(update,)))
        return out

    def learn(self, update: AliveUpdate, now: float) -> None:
        """Know a member already, without gossiping it (bootstrap in simulations).

        A member known this way is trusted as a reconnect target, as one that answered
        a probe would be.
        """
        if (update.node_id != self.node_id and update.node_id not in self._members
                and len(self._members) < self.config.max_members):
            member = _Member(self, update, now)
            member.confirmed = True  # known by configuration, not by hearsay
            self._members[update.node_id] = member
            self._add_live(update.node_id)

    def view(self) -> dict[NodeId, MemberView]:
        """Every member this participant knows, itself included."""
        out = {
            node: MemberView(node, m.state, m.machine.incarnation, m.meta)
            for node, m in self._members.items()
        }
        out[self.node_id] = MemberView(self.node_id, MemberState.Alive, self.incarnation,
                                       self.meta)
        return out

    def state_of(self, node: NodeId) -> MemberState | None:
        if node == self.node_id:
            return MemberState.Alive
        member = self._members.get(node)
        return None if member is None else member.state

    @property
    def live_members(self) -> int:
        """Members alive or suspect in this view, itself included."""
        return len(self._live) + 1

    # ------------------------------------------------------------ updates

    def _apply_all(self, updates: Iterable[Update], now: float, sender: NodeId) -> None:
        for update in updates:
            self._apply(update, now, sender)

    def _merge(self, updates: Iterable[Update], now: float, sender: NodeId) -> None:
        """Apply a full view from a `Sync`: its dead claims only as our own suspicion."""
        for update in updates:
            if (isinstance(update, DeadUpdate) and not update.is_leave
                    and update.node_id != self.node_id):
                update = SuspectUpdate(update.node_id, update.incarnation, self.node_id)
            self._apply(update, now, sender)

    def _apply(self, update: Update, now: float, sender: NodeId | None = None) -> None:
        if update.node_id == self.node_id:
            self._about_me(update, now, sender)
            return
        member = self._members.get(update.node_id)
        if isinstance(update, AliveUpdate):
            if member is None:
                if len(self._members) >= self.config.max_members:
                    self._refuse(sender or update.node_id, update.node_id,
                                 RefusalReason.TableFull, now)
                    return
                member = _Member(self, update, now)
                self._members[update.node_id] = member
                self._add_live(update.node_id)
                self._queue.push(update)
                self._changed(member, now)
                return
            event: sm.Event = sm.AliveHeard(incarnation=update.incarnation)
        elif member is None:
            if isinstance(update, DeadUpdate) and update.is_leave:
                self._failed.pop(update.node_id, None)  # it left: never a reconnect target
            return  # memberlist: suspicion or death of an unknown member is ignored
        elif isinstance(update, SuspectUpdate):
            event = sm.SuspectHeard(incarnation=update.incarnation)
        elif update.is_leave:
            event = sm.LeaveHeard(incarnation=update.incarnation)
        else:
            event = sm.DeadHeard(incarnation=update.incarnation)
        if (member.feed(event, update, sender, now) and isinstance(update, DeadUpdate)
                and update.is_leave):
            self._failed.pop(update.node_id, None)  # it left: never a reconnect target

    def _ended(self, member: _Member, update: Update, now: float) -> None:
        member.accusers = None
        self._remove_live(member.node_id)
        self._recent_dead[member.node_id] = now
        self._arm(now + self.config.dead_retention_s, "reap", member.node_id)
        self._record(member, update, now)

    def _record(self, member: _Member, update: Update, now: float) -> None:
        member.last_update = update
        member.changed_at = now
        self._queue.push(update)
        self._changed(member, now)

    def _changed(self, member: _Member, now: float) -> None:
        self._events.append(MemberChanged(member.node_id, member.state,
                                          member.machine.incarnation, member.meta, now))

    def _about_me(self, update: Update, now: float, sender: NodeId | None) -> None:
        if (update.incarnation >= MAX_INCARNATION
                or update.incarnation > self.incarnation + MAX_CLAIM_AHEAD):
            self._refuse(sender or update.author, self.node_id,
                         RefusalReason.ClaimTooFarAhead, now)
            return
        if isinstance(update, AliveUpdate):
            if update.incarnation <= self.incarnation:
                return  # our own alive, echoed
            accuser = update.node_id  # an alive from an earlier life of this member
        elif isinstance(update, DeadUpdate) and update.is_leave and self._leaving:
            return  # our own leave, echoed
        else:
            if update.incarnation < self.incarnation:
                # A stale claim (its author missed our refutation): answer it with our
                # alive on the very next message, which goes back to the author when the
                # claim rode on its probe.
                self._reassert = True
                return
            accuser = update.accuser
            self.awareness = min(self.awareness + 1, self.config.awareness_max_multiplier - 1)
        self.incarnation = update.incarnation + 1
        self._queue.push(self._self_alive())
        self._events.append(Refuted(accuser, self.incarnation, now))

    def _rearm_suspicion(self, member: _Member, now: float) -> None:
        confirmations = len(member.accusers or ()) - 1
        timeout = cfg.suspicion_timeout_s(self.config, self.live_members, confirmations)
        member.suspicion_deadline = member.suspected_at + timeout
        self._arm(max(now, member.suspicion_deadline), "suspicion", member.node_id)

    # ------------------------------------------------------------ probing

    def _on_ack(self, sender: NodeId, seq: int, now: float, out: list[Outgoing]) -> None:
        """An ack counts only when (sequence number, responder) both match."""
        probe = self._probe
        if probe is not None and probe.seq == seq:
            if sender == probe.target or sender in probe.helpers:
                probe.acked = True
                member = self._members.get(probe.target)
                if member is not None and sender == probe.target:
                    member.confirmed = True
            else:
                self._refuse(sender, probe.target, RefusalReason.WrongResponder, now)
            return
        relay = self._relays.get(seq)
        if relay is not None and not relay.done:
            if sender != relay.target:
                self._refuse(sender, relay.target, RefusalReason.WrongResponder, now)
                return
            relay.done = True
            out.append(self._send(relay.origin_address, Ack(self.node_id, relay.origin_seq),
                                  relay.origin, budget=relay.budget))

    def _relay(self, request: PingReq, now: float, out: list[Outgoing]) -> None:
        """Probe `request.target` for its sender: known members only, bounded."""
        origin = self._members.get(request.sender)
        member = self._members.get(request.target)
        if origin is None or not origin.live or member is None or not member.live:
            self._refuse(request.sender, request.target, RefusalReason.UnknownTarget, now)
            return
        if len(self._relays) >= self.config.max_relays:
            self._refuse(request.sender, request.target, RefusalReason.RelayLimit, now)
            return
        seq = self._next_seq()
        self._relays[seq] = _Relay(request.sender, origin.meta.swim_address, request.seq,
                                   request.target, request.nack, self._budget)
        timeout = self._scaled(self.config.probe_timeout_s)
        self._arm(now + timeout * _NACK_FRACTION, "relay_nack", seq)
        self._arm(now + self._scaled(self.config.probe_interval_s), "relay_end", seq)
        out.append(self._send(member.meta.swim_address, Ping(self.node_id, seq, request.target),
                              request.target, budget=self._budget))

    def _next_seq(self) -> int:
        """A random probe sequence number not in use (an ack cannot be guessed ahead)."""
        while True:
            seq = self._seq_rng.randint(1, MAX_SEQ)
            if seq not in self._relays and (self._probe is None or self._probe.seq != seq):
                return seq

    def _refuse(self, sender: NodeId, node: NodeId, reason: RefusalReason, now: float) -> None:
        self._events.append(Refused(sender, node, reason, now))

    def _next_target(self) -> NodeId | None:
        for _ in range(2):
            while self._probe_index < len(self._probe_order):
                node = self._probe_order[self._probe_index]
                self._probe_index += 1
                member = self._members.get(node)
                if member is not None and member.live:
                    return node
            self._probe_order = list(self._live)
            self._rng.shuffle(self._probe_order)
            self._probe_index = 0
        return None

    def _start_probe(self, now: float, out: list[Outgoing]) -> None:
        target = self._next_target()
        if target is None:
            self._probe = None
            return
        seq = self._next_seq()
        self._probe = _Probe(seq, target)
        member = self._members[target]
        ping = self._send(member.meta.swim_address, Ping(self.node_id, seq, target), target)
        if member.machine.state is sm.State.Suspect:
            # memberlist: tack the suspicion onto the probe so the target can refute at once
            claim = SuspectUpdate(target, member.machine.incarnation, self.node_id)
            ping = Outgoing(ping.address, _with_updates(ping.message,
                                                        (claim, *ping.message.updates)), target)
        out.append(ping)
        self._arm(now + self._scaled(self.config.probe_timeout_s), "probe_timeout", seq)

    def _probe_timeout(self, seq: int, now: float, out: list[Outgoing]) -> None:
        probe = self._probe
        if probe is None or probe.seq != seq or probe.acked:
            return
        target = self._members.get(probe.target)
        if target is None:
            return
        helpers = self._random_members(self.config.indirect_checks, exclude=probe.target)
        probe.expected_nacks = len(helpers)
        probe.helpers = frozenset(helpers)
        for node in helpers:
            helper = self._members[node]
            out.append(self._send(helper.meta.swim_address,
                                  PingReq(self.node_id, seq, probe.target), node))

    def _finish_probe(self, now: float) -> None:
        probe = self._probe
        self._probe = None
        if probe is None:
            return
        if probe.acked:
            self.awareness = max(0, self.awareness - 1)
            return
        delta = probe.expected_nacks - probe.nacks if probe.expected_nacks > 0 else 1
        self.awareness = min(self.awareness + delta, self.config.awareness_max_multiplier - 1)
        member = self._members.get(probe.target)
        if member is not None and member.live:
            self._apply(SuspectUpdate(probe.target, member.machine.incarnation, self.node_id),
                        now)

    # ------------------------------------------------------------ timers

    def _arm(self, when: float, kind: str, key: int) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, kind, key))

    def _fire(self, kind: str, key: int, now: float, out: list[Outgoing]) -> None:
        if kind == "probe":
            self._finish_probe(now)
            self._start_probe(now, out)
            self._arm(now + self._scaled(self.config.probe_interval_s), "probe", 0)
        elif kind == "probe_timeout":
            self._probe_timeout(key, now, out)
        elif kind == "gossip":
            self._gossip(out)
            self._arm(now + self.config.gossip_interval_s, "gossip", 0)
        elif kind == "suspicion":
            member = self._members.get(NodeId(key))
            if (member is not None and member.machine.state is sm.State.Suspect
                    and member.suspicion_deadline <= now):
                member.feed(sm.SuspicionTimeout(), None, None, now)
        elif kind == "relay_nack":
            relay = self._relays.get(key)
            if relay is not None and not relay.done and relay.nack:
                if relay.budget is not None:
                    relay.done = True  # unauthenticated: one answer per request
                out.append(self._send(relay.origin_address, Nack(self.node_id, relay.origin_seq),
                                      relay.origin, budget=relay.budget))
        elif kind == "relay_end":
            self._relays.pop(key, None)
        elif kind == "reap":
            member = self._members.get(NodeId(key))
            if (member is not None and not member.live
                    and member.changed_at + self.config.dead_retention_s <= now):
                member.feed(sm.Forget(), None, None, now)
        elif kind == "join":
            if not self.joined:
                out.extend(self._join_messages())
                self._arm(now + self.config.join_retry_s, "join", 0)
        elif kind == "push_pull":
            for node in self._random_members(1, exclude=None):
                out.append(self._send(self._members[node].meta.swim_address,
                                      Sync(self.node_id, True), node,
                                      updates=self._full_state()))
            self._arm(now + self.config.push_pull_interval_s, "push_pull", 0)
        elif kind == "reconnect":
            self._reconnect(now, out)
            self._arm(now + self._reconnect_period(), "reconnect", 0)

    def _reconnect_period(self) -> float:
        return cfg.reconnect_period_s(self.config, len(self._members) + 1)

    def _reconnect(self, now: float, out: list[Outgoing]) -> None:
        """Full-state sync with the next members declared dead, and the seeds when alone."""
        horizon = now - self.config.reconnect_timeout_s
        for node, (_, since) in list(self._failed.items()):
            if since < horizon:
                del self._failed[node]
        targets: list[tuple[Address, NodeId | None]] = []
        failed = list(self._failed.items())
        if failed:
            count = min(len(failed), self.config.reconnect_nodes)
            start = self._reconnect_cursor % len(failed)
            self._reconnect_cursor = start + count
            targets = [(address, node) for node, (address, _)
                       in (failed + failed)[start:start + count]]
        if not self._live:
            targets.extend((seed, None) for seed in self._seeds
                           if seed not in {address for address, _ in targets})
        for address, target in targets:
            out.append(self._send(address, Sync(self.node_id, True), target,
                                  updates=self._full_state()))
    # ------------------------------------------------------------ sending

    def _gossip(self, out: list[Outgoing]) -> None:
        if not len(self._queue):
            return
        targets = self._random_members(self.config.gossip_nodes, exclude=None, dead_too=True)
        for node in targets:
            updates = self._take()
            if not updates:
                break
            out.append(Outgoing(self._members[node].meta.swim_address,
                                Gossip(self.node_id, updates), node))
            self.sent_messages += 1

    def _send(self, address: Address, message: Message, to: NodeId | None,
              updates: tuple[Update, ...] | None = None,
              budget: int | None = None) -> Outgoing:
        piggyback = self._take() if updates is None else updates
        if self._reassert:
            self._reassert = False
            piggyback = (self._self_alive(), *piggyback)
        if piggyback:
            message = _with_updates(message, piggyback)
        self.sent_messages += 1
        return Outgoing(address, message, to, budget)

    def _take(self) -> tuple[Update, ...]:
        limit = cfg.retransmit_limit(self.config, self.live_members)
        return self._queue.take(self.config.max_piggyback, limit)

    def _join_messages(self) -> list[Outgoing]:
        return [
            self._send(seed, Sync(self.node_id, True), None, updates=(self._self_alive(),))
            for seed in self._seeds
        ]

    def _full_state(self) -> tuple[Update, ...]:
        return (self._self_alive(), *(m.last_update for m in self._members.values()))

    def _self_alive(self) -> AliveUpdate:
        return AliveUpdate(self.node_id, self.incarnation, self.meta)

    def _scaled(self, seconds: float) -> float:
        return seconds * (self.awareness + 1)

    def _random_members(self, count: int, exclude: NodeId | None,
                        dead_too: bool = False) -> list[NodeId]:
        pool = self._live
        picked: list[NodeId] = []
        if pool:
            wanted = min(len(pool), count + 1)
            picked = [n for n in self._rng.sample(pool, wanted) if n != exclude][:count]
        if dead_too and len(picked) < count and self._recent_dead:
            horizon = self._now - self.config.gossip_to_the_dead_s
            for node, since in list(self._recent_dead.items()):
                if since < horizon:
                    del self._recent_dead[node]
            recent = list(self._recent_dead)
            self._rng.shuffle(recent)
            picked.extend(recent[: count - len(picked)])
        return picked

    def _add_live(self, node: NodeId) -> None:
        if node not in self._live_index:
            self._live_index[node] = len(self._live)
            self._live.append(node)

    def _remove_live(self, node: NodeId) -> None:
        index = self._live_index.pop(node, None)
        if index is None:
            return
        last = self._live.pop()
        if last != node:
            self._live[index] = last
            self._live_index[last] = index


def _with_updates(message: Message, updates: tuple[Update, ...]) -> Message:
    match message:
        case Ping(sender=s, seq=q, target=t):
            return Ping(s, q, t, updates)
        case Ack(sender=s, seq=q):
            return Ack(s, q, updates)
        case Nack(sender=s, seq=q):
            return Nack(s, q, updates)
        case PingReq(sender=s, seq=q, target=t, nack=n):
            return PingReq(s, q, t, n, updates)
        case Gossip(sender=s):
            return Gossip(s, updates)
        case Sync(sender=s, reply=r):
            return Sync(s, r, updates)
    raise TypeError(f"not a SWIM message: {type(message).__name__}")
