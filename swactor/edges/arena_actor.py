"""`ArenaActor`: the node's ArenaManager behind one mailbox (spec §19).

Theory of operation
-------------------
`swactor.arena.ArenaManager` is sans-I/O: each call feeds one event to the generated
arena_manager machine and returns the outputs to deliver. This actor owns one manager
and turns mail into those calls, so every lease, cancel and release of the node is
serialised by one mailbox (what keeps two live leases from overlapping and makes
"CancelLease is answered after any grant already sent" true).

Mail (each request names the actor its answers go to, `reply_to`):

- `ArenaLease` -> `Granted` now, or `Queued` and a `Granted` later, or `Rejected`;
- `ArenaCancel` -> `Cancelled` (after any `Granted` already sent for the request);
- `ArenaRelease` -> `Released` or `ReleaseRefused` (a release may also grant queued
  leases of other requesters: those `Granted` go to their own requester);
- `ArenaShutdown` -> the manager's shutdown (queued leases `Rejected`);
- `ArenaLiveLeases` (ask) -> `list[LiveLease]`, for teardown checks and tests.

Outputs carrying a `requester` go to the ref registered under that requester name
(the `str` of its address); the others answer the message being handled. Timer outputs
are armed on this actor's timers and fed back as `timer_fired`. Node-level notices
(`ArenaUp`, `ArenaDown`, `ArenaUnmapped`) go to `notices` when one is given.

The manager is constructed (`construct()`) and its minter taken (`take_minter()`) by the
node before the actor starts: the minter belongs to the teardown path (the
EdgeEstablisher), never to this actor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from swactor.actors import Actor, ActorRef, Context
from swactor.arena import (
    ArenaDown,
    ArenaManager,
    ArenaUnmapped,
    ArenaUp,
    Granted,
    Output,
    Queued,
    Rejected,
)
from swactor.fsm.runtime import CancelTimer, StartTimer
from swactor.wire import (
    EdgeId,
    LeaseRequestId,
    QuiescenceProof,
    RingDirection,
    RingId,
    RingSpec,
)

log = logging.getLogger("swactor.edges.arena")


@dataclass(frozen=True, slots=True)
class ArenaLease:
    """LeaseRing (§19) from `reply_to`."""

    request_id: LeaseRequestId
    edge_id: EdgeId
    direction: RingDirection
    spec: RingSpec
    reply_to: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class ArenaCancel:
    """CancelLease (§19)."""

    request_id: LeaseRequestId
    reply_to: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class ArenaRelease:
    """ReleaseRing with its quiescence proof (§19, §38)."""

    ring_id: RingId
    proof: QuiescenceProof
    reply_to: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class ArenaShutdown:
    """Shutdown: reject queued and new leases; stop once no lease is live."""


@dataclass(frozen=True, slots=True)
class ArenaLiveLeases:
    """Ask: the live leases now (`list[LiveLease]`)."""


@dataclass(frozen=True, slots=True)
class _ArenaTimer:
    name: str


ArenaMail = ArenaLease | ArenaCancel | ArenaRelease | ArenaShutdown | ArenaLiveLeases | _ArenaTimer


class ArenaActor(Actor[ArenaMail]):
    """Hosts one constructed `ArenaManager` (module docstring)."""

    def __init__(self, manager: ArenaManager, notices: ActorRef[Any] | None = None) -> None:
        self.manager = manager
        self.notices = notices
        self._requesters: dict[str, ActorRef[Any]] = {}

    async def receive(self, ctx: Context[ArenaMail], message: ArenaMail) -> None:
        reply_to: ActorRef[Any] | None = None
        match message:
            case ArenaLease(request_id, edge_id, direction, spec, reply_to):
                requester = str(reply_to.address)
                self._requesters[requester] = reply_to
                outputs = self.manager.lease(request_id, requester, edge_id, direction, spec)
            case ArenaCancel(request_id, reply_to):
                outputs = self.manager.cancel(request_id)
            case ArenaRelease(ring_id, proof, reply_to):
                outputs = self.manager.release(ring_id, proof)
            case ArenaShutdown():
                outputs = self.manager.shutdown()
            case ArenaLiveLeases():
                ctx.reply(self.manager.live_leases())
                return
            case _ArenaTimer(name):
                outputs = self.manager.timer_fired(name)
        self._deliver(ctx, outputs, reply_to)

    def _deliver(
        self, ctx: Context[ArenaMail], outputs: list[Output], reply_to: ActorRef[Any] | None
    ) -> None:
        for output in outputs:
            match output:
                case StartTimer(name=name, seconds=seconds):
                    ctx.timers.start(name, seconds, _ArenaTimer(name))
                case CancelTimer(name=name):
                    ctx.timers.cancel(name)
                case ArenaUp() | ArenaDown() | ArenaUnmapped():
                    if self.notices is not None:
                        self.notices.tell(output)
                case Granted() | Queued() | Rejected():
                    target = self._requesters.get(output.requester)
                    if target is None:
                        log.warning("arena: no requester %r for %s", output.requester,
                                    type(output).__name__)
                    else:
                        target.tell(output)
                case _:
                    if reply_to is not None:
                        reply_to.tell(output)
