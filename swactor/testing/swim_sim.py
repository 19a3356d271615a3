"""A seeded, single-process simulation of a SWIM pool: simulated clock and network.

Theory of operation
-------------------
`Simulation` runs N `SwimCore`s against one event heap ordered by simulated time. A
message a core sends is lost with probability `loss`, else delivered after a latency
drawn uniformly from `latency_s`. Each member is ticked exactly when its core's
`next_deadline()` says. Everything random (member order, losses, latencies, the cores'
own choices) comes from `random.Random(seed)`, so a run is a pure function of its
arguments.

Faults: `crash(i)` drops everything to and from member i from then on; `pause(i, s)`
freezes it for s seconds (no ticks; arriving messages queue and are handled, in order,
when it resumes, as a process stalled by GC or a busy loop would read its socket);
`available=True` gives every member booted metadata with a (fake) QUIC endpoint, for
pool-readiness runs. `restart(i)` replaces a crashed member's core with a fresh one at
incarnation 0 that joins through a seed, as a restarted process would.
`partition(groups)` cuts the network between groups of members (every message from one
group to another is lost; counted in `cut`) until `heal()`, as a pulled cable would.

Membership events of every core are kept in `events` as (time, member index, event);
`first_state_time` answers "when did observer o first see member t in state s".
Messages sent per member are counted for the load figures of the benchmark, and the
first Ping sent to a crashed member is timed (`first_probe_of_crashed`).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from swactor.membership.config import SwimConfig
from swactor.membership.core import SwimCore
from swactor.membership.messages import (
    Address,
    AliveUpdate,
    BootHealth,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MemberState,
    Message,
    Outgoing,
    Ping,
)
from swactor.wire import NodeId


def sim_address(index: int) -> Address:
    return ("sim", index)


def sim_node_id(index: int) -> NodeId:
    return NodeId(index + 1)


@dataclass(slots=True)
class _SimMember:
    core: SwimCore
    tick_at: float = float("inf")
    crashed: bool = False
    paused_until: float = 0.0
    backlog: list[tuple[Message, Address]] = field(default_factory=list)
    sent: int = 0


class Simulation:
    """N SWIM members on a simulated lossy network (see the module docstring)."""

    def __init__(
        self,
        members: int,
        seed: int,
        config: SwimConfig | None = None,
        *,
        loss: float = 0.0,
        latency_s: tuple[float, float] = (0.0005, 0.002),
        available: bool = False,
    ) -> None:
        if members < 1:
            raise ValueError(f"Simulation needs at least one member, got {members}")
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        self.config = config or SwimConfig()
        self.rng = random.Random(seed)
        self.loss = loss
        self.latency_s = latency_s
        self.available = available
        self.now = 0.0
        self.events: list[tuple[float, int, MembershipEvent]] = []
        self.delivered = 0
        self.first_probe_of_crashed: dict[int, float] = {}
        """Member index -> when the first Ping was sent to it after it crashed."""
        self.dropped = 0
        self.cut = 0
        """Messages lost to a partition (not counted in `dropped`)."""
        self._side: dict[int, int] = {}
        self._heap: list[tuple[float, int, int, int, object]] = []
        self._seq = 0
        self._first: dict[tuple[int, NodeId, MemberState], float] = {}
        self.members = [self._new_member(i, 0) for i in range(members)]
        alive = [
            AliveUpdate(m.core.node_id, m.core.incarnation, m.core.meta) for m in self.members
        ]
        for index, member in enumerate(self.members):
            for other, update in enumerate(alive):
                if other != index:
                    member.core.learn(update, 0.0)
            member.core.take_events()
        for index, member in enumerate(self.members):
            self._route(index, member.core.start(0.0))
            self._reschedule(index)

    # ------------------------------------------------------------ control

    def crash(self, index: int) -> None:
        """Member `index` stops: no more ticks, sends or deliveries."""
        self.members[index].crashed = True

    def pause(self, index: int, seconds: float) -> None:
        """Member `index` stalls for `seconds` of simulated time, then catches up."""
        member = self.members[index]
        member.paused_until = self.now + seconds
        self._push(member.paused_until, _RESUME, index, None)

    def restart(self, index: int, seed_index: int) -> None:
        """Replace crashed member `index` with a fresh core (incarnation 0) joining via a seed."""
        old = self.members[index]
        fresh = self._new_member(index, 0)
        fresh.sent = old.sent
        self.members[index] = fresh
        self._route(index, fresh.core.start(self.now, [sim_address(seed_index)]))
        self._reschedule(index)

    def partition(self, *groups: list[int]) -> None:
        """Cut the network between `groups` (members left out form one more group)."""
        side = {index: number for number, group in enumerate(groups) for index in group}
        if len(side) != sum(len(group) for group in groups):
            raise ValueError("a member is in more than one partition group")
        if not all(0 <= index < len(self.members) for index in side):
            raise ValueError(f"partition groups name members outside 0..{len(self.members) - 1}")
        self._side = {i: side.get(i, len(groups)) for i in range(len(self.members))}

    def heal(self) -> None:
        """Restore the network between every member."""
        self._side = {}

    def run_until(self, when: float) -> None:
        """Process every event up to simulated time `when`."""
        heap = self._heap
        while heap and heap[0][0] <= when:
            at, _, kind, index, payload = heapq.heappop(heap)
            self.now = at
            member = self.members[index]
            if member.crashed:
                continue
            if kind == _TICK:
                if at != member.tick_at:
                    continue
                member.tick_at = float("inf")
                if member.paused_until > at:
                    continue
                self._route(index, member.core.tick(at))
            elif kind == _DELIVER:
                assert isinstance(payload, tuple)
                message, source = payload
                if member.paused_until > at:
                    member.backlog.append((message, source))
                    continue
                self.delivered += 1
                self._route(index, member.core.handle(message, source, at))
            else:  # resume
                if member.paused_until > at:
                    continue
                backlog, member.backlog = member.backlog, []
                for message, source in backlog:
                    self.delivered += 1
                    self._route(index, member.core.handle(message, source, at))
                self._route(index, member.core.tick(at))
            self._collect(index)
            self._reschedule(index)
        self.now = max(self.now, when)

    # ------------------------------------------------------------ queries

    def first_state_time(self, observer: int, target: NodeId, state: MemberState) -> float | None:
        """When `observer` first saw `target` enter `state` (None if it never did)."""
        return self._first.get((observer, target, state))

    def states_of(self, target: NodeId) -> dict[int, MemberState | None]:
        """`target`'s state in every running member's view (crashed members left out)."""
        return {
            i: m.core.state_of(target)
            for i, m in enumerate(self.members)
            if not m.crashed and m.core.node_id != target
        }

    def messages_sent(self) -> int:
        return sum(m.sent for m in self.members)

    # ------------------------------------------------------------ internals

    def _new_member(self, index: int, incarnation: int) -> _SimMember:
        meta = MemberMeta(swim_host="sim", swim_port=index)
        if self.available:
            meta = MemberMeta("sim", index, "sim", 10000 + index, BootHealth.Available, "sim", 1)
        core = SwimCore(self.config, sim_node_id(index), meta,
                        random.Random(self.rng.getrandbits(64)), incarnation=incarnation)
        return _SimMember(core)

    def _push(self, at: float, kind: int, index: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, index, payload))

    def _route(self, index: int, outgoing: list[Outgoing]) -> None:
        member = self.members[index]
        source = sim_address(index)
        low, high = self.latency_s
        for out in outgoing:
            member.sent += 1
            dest = out.address[1]
            if (self.members[dest].crashed and dest not in self.first_probe_of_crashed
                    and isinstance(out.message, Ping)):
                self.first_probe_of_crashed[dest] = self.now
            if self._side and self._side[index] != self._side[dest]:
                self.cut += 1
                continue
            if self.loss and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            self._push(self.now + self.rng.uniform(low, high), _DELIVER, dest,
                       (out.message, source))

    def _reschedule(self, index: int) -> None:
        member = self.members[index]
        deadline = member.core.next_deadline()
        if deadline < member.tick_at:
            member.tick_at = deadline
            self._push(deadline, _TICK, index, None)

    def _collect(self, index: int) -> None:
        for event in self.members[index].core.take_events():
            self.events.append((self.now, index, event))
            if isinstance(event, MemberChanged):
                self._first.setdefault((index, event.node_id, event.state), self.now)


_TICK = 0
_DELIVER = 1
_RESUME = 2
