"""ArenaManager: the binding of the generated `arena_manager` machine (spec §19).

Theory of operation
-------------------
The table (`fsm/arena_manager.yaml`, generated into
`swactor.fsm.generated.arena_manager`) makes every decision: grant, queue or reject a
lease, accept or refuse a release, when to stop.  This binding owns the bookkeeping the
table leaves to it - the arena itself, the aligned free list, the FIFO of queued
requests, the table of live leases, the RingId counter - answers the table's guards
from that bookkeeping, and carries out the effects.  It is sans-I/O towards actors:
each public call feeds one event and returns the list of `Output`s to deliver (replies
to requesters, notices to NodeBoot, timers to arm), in order.  The actor that owns the
manager's mailbox delivers them; one mailbox is what keeps two live leases from
overlapping.

Lease geometry: a lease is one 4 KiB header page followed by the data region, whose
start is aligned to the spec's alignment (at least a page), so
`data_offset = arena_offset + 4096` and `total_len = 4096 + round_up(capacity, 4096)`.
On a grant the binding writes a fresh ring header (`Ring.init`) into the header page,
so the layout it replies with can be opened at once by the pump and the worker.
RingIds count up from 1 and are never reused in the manager's (the node's) lifetime.

Releases need a quiescence proof minted by this manager's `QuiescenceMinter`, which
the node hands only to its teardown path (`take_minter()`, once); see `proofs.py`.
A released range goes back to the free list (coalesced) and the queue is retried in
order.  `live_leases()` reports what is still leased (a finished run must leave none).

Cancel after grant: one mailbox, FIFO, so a request that was granted before its
CancelLease arrived got its `Granted` first; the `Cancelled` reply then names the
granted ring (`granted_ring`), and the requester releases it unused with
`minter.never_installed(ring_id)` - it is never installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from swactor.arena.allocator import FreeList, align_up
from swactor.arena.arena import Arena, ArenaBusyError, ArenaError
from swactor.arena.proofs import QuiescenceMinter
from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import arena_manager as fsm
from swactor.fsm.host import MachineHost
from swactor.fsm.runtime import CancelTimer, StartTimer
from swactor.ring.ring import DEFAULT_VERSION, Ring
from swactor.wire import (
    RING_HEADER_PAGE,
    ArenaFailure,
    EdgeId,
    LeaseRequestId,
    QuiescenceProof,
    RingDirection,
    RingId,
    RingLayout,
    RingSpec,
)

HEADER_PAGE = RING_HEADER_PAGE

# -- outputs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArenaUp:
    """To NodeBoot: the arena is created and mapped."""


@dataclass(frozen=True, slots=True)
class ArenaDown:
    """To NodeBoot: the arena could not be created."""

    reason: ArenaFailure


@dataclass(frozen=True, slots=True)
class Granted:
    """RingLeased to `requester`: the layout of its ring (header already written)."""

    request_id: LeaseRequestId
    requester: str
    edge_id: EdgeId
    direction: RingDirection
    layout: RingLayout


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits for space (temporary arena pressure); a Granted follows later
    unless it is cancelled or the manager shuts down."""

    request_id: LeaseRequestId
    requester: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """RingLeaseRejected to `requester` (LeaseNeverFits or ShuttingDown)."""

    request_id: LeaseRequestId
    requester: str
    reason: ArenaFailure


@dataclass(frozen=True, slots=True)
class Cancelled:
    """LeaseCancelled: no grant for the request will follow.  `granted_ring` names the
    ring it was already granted, which the requester must release unused."""

    request_id: LeaseRequestId
    granted_ring: RingId | None


@dataclass(frozen=True, slots=True)
class Released:
    """RingReleased: the range is back on the free list."""

    ring_id: RingId


@dataclass(frozen=True, slots=True)
class ReleaseRefused:
    """ReleaseRejected: the proof was not valid for a live lease; nothing changed."""

    ring_id: RingId


@dataclass(frozen=True, slots=True)
class ArenaUnmapped:
    """The manager stopped; `abandoned` leases were still live (shutdown timeout)."""

    abandoned: tuple[RingId, ...]


Output: TypeAlias = (
    ArenaUp
    | ArenaDown
    | Granted
    | Queued
    | Rejected
    | Cancelled
    | Released
    | ReleaseRefused
    | ArenaUnmapped
    | StartTimer
    | CancelTimer
)


@dataclass(frozen=True, slots=True)
class LiveLease:
    """One live ring lease."""

    ring_id: RingId
    request_id: LeaseRequestId
    requester: str
    edge_id: EdgeId
    direction: RingDirection
    layout: RingLayout
    cancelled: bool = False


class ArenaManagerError(ValueError):
    """A call the binding refuses before it reaches the table (a caller bug)."""


def lease_geometry(spec: RingSpec) -> tuple[int, int]:
    """(total lease bytes, data alignment) for a spec."""
    return HEADER_PAGE + align_up(spec.data_capacity, HEADER_PAGE), max(
        spec.alignment, HEADER_PAGE
    )


class _TimerOutputs:
    """The host's timers of an ArenaManager: each start/cancel is an output for the caller,
    which runs the timer and feeds it back (`ArenaManager.timer_fired`)."""

    def __init__(self, manager: ArenaManager) -> None:
        self._manager = manager

    def start(self, name: str, seconds: float, message: fsm.Event) -> None:
        self._manager._out.append(StartTimer(name, seconds))

    def cancel(self, name: str) -> None:
        self._manager._out.append(CancelTimer(name))


class ArenaManager(fsm.ArenaManagerEffects[None]):
    """The node's ArenaManager; see the module docstring."""

    def __init__(
        self,
        ceiling: int,
        *,
        shutdown_grace_s: float = 5.0,
        ring_version: int = DEFAULT_VERSION,
        create_arena: Callable[[int], Arena] = Arena.create,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.ceiling = ceiling
        self._faults = faults
        # ledger fact for `fits_now`: the fault port's arena.pressure, asked once before
        # each event is fed (a guard reads, it never asks outside)
        self._pressure = False
        self.arena: Arena | None = None
        self._ring_version = ring_version
        self._create_arena = create_arena
        self._free = FreeList(ceiling)
        self._queue: list[fsm.LeaseRing] = []
        self._live: dict[int, LiveLease] = {}
        self._next_ring_id = 1
        self._minter: QuiescenceMinter | None = QuiescenceMinter()
        self._proofs = self._minter
        self._out: list[Output] = []
        self._machine = fsm.ArenaManagerMachine(self, shutdown_grace_s=shutdown_grace_s)
        self._host = MachineHost(self._machine, fsm.bind(self), timers=_TimerOutputs(self),
                                 timer_events=fsm.TIMER_EVENTS)
        self._requesters: dict[int, str] = {}

    # -- public API ---------------------------------------------------------------------

    @property
    def state(self) -> fsm.State:
        return self._machine.state

    def take_minter(self) -> QuiescenceMinter:
        """Hand the proof-minting capability to the teardown path (once only)."""
        if self._minter is None:
            raise ArenaManagerError("the quiescence minter was already handed out")
        minter, self._minter = self._minter, None
        return minter

    def construct(self) -> list[Output]:
        """ConstructArena: create, seal and map the arena of `ceiling` bytes."""
        return self._feed(fsm.ConstructArena(ceiling=self.ceiling))

    def lease(
        self,
        request_id: LeaseRequestId,
        requester: str,
        edge_id: EdgeId,
        direction: RingDirection,
        spec: RingSpec,
    ) -> list[Output]:
        """LeaseRing: Granted now, Queued, or Rejected."""
        rid = int(request_id)
        if rid in self._requesters:
            raise ArenaManagerError(f"lease request {rid} is already queued or live")
        event = fsm.LeaseRing(
            request_id=request_id,
            requester=requester,
            edge_id=edge_id,
            direction=direction,
            ring_spec=spec,
        )
        self._requesters[rid] = requester
        try:
            return self._feed(event)
        finally:
            if not self._holds(rid):  # rejected, or absorbed by a terminal state
                self._requesters.pop(rid, None)

    def cancel(self, request_id: LeaseRequestId) -> list[Output]:
        """CancelLease: withdraw a request (see the module doc for cancel after grant)."""
        return self._feed(fsm.CancelLease(request_id=request_id))

    def release(self, ring_id: RingId, proof: QuiescenceProof) -> list[Output]:
        """ReleaseRing: Released if `proof` is valid for the live lease, else refused."""
        return self._feed(fsm.ReleaseRing(ring_id=ring_id, proof=proof))

    def shutdown(self) -> list[Output]:
        """Shutdown: reject queued and new leases; stop once no lease is live."""
        return self._feed(fsm.Shutdown())

    def timer_fired(self, name: str) -> list[Output]:
        """Feed back a timer armed by a StartTimer output."""
        return self._feed(fsm.TIMER_EVENTS[name]())

    def live_leases(self) -> list[LiveLease]:
        """The live leases, in RingId order."""
        return [self._live[k] for k in sorted(self._live)]

    def queued_requests(self) -> list[LeaseRequestId]:
        return [e.request_id for e in self._queue]

    @property
    def free_extents(self) -> list[tuple[int, int]]:
        return self._free.extents

    def _holds(self, request_id: int) -> bool:
        return any(int(e.request_id) == request_id for e in self._queue) or any(
            int(lease.request_id) == request_id for lease in self._live.values()
        )

    # -- guards (pure) ------------------------------------------------------------------

    def fits_now(self, event: fsm.LeaseRing) -> bool:
        if self._pressure:  # arena.pressure, read from the Faults port before the event
            return False
        size, align = lease_geometry(event.ring_spec)
        return self._free.find(size, align, HEADER_PAGE) is not None

    def can_ever_fit(self, event: fsm.LeaseRing) -> bool:
        size, align = lease_geometry(event.ring_spec)
        return self._free.can_ever_fit(size, align, HEADER_PAGE)

    def proof_valid(self, event: fsm.ReleaseRing) -> bool:
        proof = event.proof
        return (
            int(proof.ring_id) == int(event.ring_id)
            and int(event.ring_id) in self._live
            and self._proofs.issued(proof)
        )

    def has_live_leases(self, event: fsm.Shutdown) -> bool:
        return bool(self._live)

    def releases_last_lease(self, event: fsm.ReleaseRing) -> bool:
        return self.proof_valid(event) and len(self._live) == 1

    # -- effects (ArenaManagerEffects) --------------------------------------------------

    def _feed(self, event: fsm.Event) -> list[Output]:
        self._out = []
        self._pressure = self._faults.lease_pressure()
        self._host.feed(event)
        out, self._out = self._out, []
        return out

    def create_arena(self, ceiling: int) -> None:
        try:
            self.arena = self._create_arena(ceiling)
        except ArenaError as exc:
            self._host.feed(fsm.ArenaBootFailed(reason=exc.reason))
        else:
            self._host.feed(fsm.ArenaConstructed())

    def arena_ready(self) -> None:
        self._out.append(ArenaUp())

    def arena_failed(self, reason: ArenaFailure) -> None:
        self._out.append(ArenaDown(reason))

    def _grant(self, event: fsm.LeaseRing) -> Granted:
        size, align = lease_geometry(event.ring_spec)
        start = self._free.find(size, align, HEADER_PAGE)
        assert start is not None, "fits_now said yes"
        self._free.take(start, size)
        ring_id = RingId(self._next_ring_id)
        self._next_ring_id += 1
        layout = RingLayout.at(ring_id, start, event.ring_spec.data_capacity,
                               alignment=event.ring_spec.alignment, total_len=size)
        assert self.arena is not None
        Ring.init(self.arena, layout, self._ring_version).close()
        self._live[int(ring_id)] = LiveLease(
            ring_id, event.request_id, event.requester, event.edge_id, event.direction, layout
        )
        return Granted(event.request_id, event.requester, event.edge_id, event.direction, layout)

    def ring_leased(self, request_id: LeaseRequestId, requester: str, edge_id: EdgeId,
                    direction: RingDirection, ring_spec: RingSpec) -> None:
        self._out.append(self._grant(
            fsm.LeaseRing(request_id, requester, edge_id, direction, ring_spec)))

    def queue_lease(self, request_id: LeaseRequestId, requester: str, edge_id: EdgeId,
                    direction: RingDirection, ring_spec: RingSpec) -> None:
        self._queue.append(fsm.LeaseRing(request_id, requester, edge_id, direction, ring_spec))
        self._out.append(Queued(request_id, requester))

    def ring_lease_rejected(self, request_id: LeaseRequestId, reason: ArenaFailure) -> None:
        requester = self._requesters.pop(int(request_id), "")
        self._out.append(Rejected(request_id, requester, reason))

    def lease_cancelled(self, request_id: LeaseRequestId) -> None:
        rid = int(request_id)
        self._queue = [e for e in self._queue if int(e.request_id) != rid]
        granted: RingId | None = None
        for key, lease in self._live.items():
            if int(lease.request_id) == rid:
                granted = lease.ring_id
                self._live[key] = LiveLease(
                    lease.ring_id, lease.request_id, lease.requester, lease.edge_id,
                    lease.direction, lease.layout, cancelled=True,
                )  # fmt: skip
        if granted is None:
            self._requesters.pop(rid, None)
        self._out.append(Cancelled(request_id, granted))

    def ring_released(self, ring_id: RingId, proof: QuiescenceProof) -> None:
        lease = self._live.pop(int(ring_id))
        self._free.give(lease.layout.arena_offset, lease.layout.total_len)
        self._proofs.retire(int(ring_id))
        self._requesters.pop(int(lease.request_id), None)
        self._out.append(Released(ring_id))

    def retry_queued_leases(self) -> None:
        waiting, self._queue = self._queue, []
        for event in waiting:
            if self.fits_now(event):
                self._out.append(self._grant(event))
            else:
                self._queue.append(event)

    def release_rejected(self, ring_id: RingId) -> None:
        self._out.append(ReleaseRefused(ring_id))

    def reject_queued_leases(self) -> None:
        for event in self._queue:
            self._requesters.pop(int(event.request_id), None)
            self._out.append(Rejected(event.request_id, event.requester, ArenaFailure.ShuttingDown))
        self._queue = []

    def unmap_arena(self) -> None:
        abandoned = tuple(lease.ring_id for lease in self.live_leases())
        if self.arena is not None:
            # ArenaBusyError: a handle still views it; the mapping goes with the process
            with contextlib.suppress(ArenaBusyError):
                self.arena.close()
        self._out.append(ArenaUnmapped(abandoned))
