"""Pool readiness (spec §9) on the orchestrator, bound to the generated `pool_readiness` machine.

Theory of operation
-------------------
The orchestrator knows its intended candidate pool (node ids). `PoolReadiness` keeps the
orchestrator's view of each candidate, fed from its own SWIM participant's
`MemberChanged` events (state, incarnation, metadata: boot health and QUIC endpoint) and,
where NodeAvailable arrives by another channel, `node_available()`. Every change to a
candidate's view is one `MemberChanged` event of the machine; the machine asks the guard
`pool_complete`, which this binding answers: every candidate known, alive (not suspect,
dead or left), NodeAvailable (boot health `available` or reported), with QUIC endpoint
material, and none faulted (boot health `unavailable`); after a plan is committed it asks
`candidate_lost` (the changed candidate dead, left, removed or unavailable: a suspect is
not lost).

Time is an input. The machine's convergence-window timer (`StartTimer`/`CancelTimer`)
becomes a deadline here; `tick(now)` feeds `ConvergenceWindowElapsed` once it passes.
Any change while converging re-enters Converging, so flapping restarts the window.

What the orchestrator sees (`take_outcomes()`): `PoolReadyReached` (after the
`pool_ready` lifecycle event is emitted), `ReadinessLost` (before a plan is committed:
keep waiting), `MembershipLost(node_id)` (after `plan_committed`: the run faults), and
`WaitingAborted`. `wait_pool_ready` runs the whole thing on asyncio from a
`MembershipNode`'s event queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import swactor.fsm.generated.pool_readiness as pr
from swactor.events import Emitter, PoolReady, default_emitter
from swactor.fsm.host import MachineHost
from swactor.membership.messages import (
    BootHealth,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MemberState,
)
from swactor.wire import NodeId, RunId


@dataclass(frozen=True, slots=True)
class PoolReadyReached:
    """PoolReady: planning may build and commit a RunPlan."""

    at: float


@dataclass(frozen=True, slots=True)
class ReadinessLost:
    """Readiness was lost before a plan was committed; planning must wait."""

    at: float


@dataclass(frozen=True, slots=True)
class MembershipLost:
    """A candidate was lost after provisioning began; the run faults."""

    node_id: NodeId
    at: float


@dataclass(frozen=True, slots=True)
class WaitingAborted:
    """The operator aborted before provisioning."""

    at: float


Outcome = PoolReadyReached | ReadinessLost | MembershipLost | WaitingAborted


@dataclass(slots=True)
class CandidateView:
    """The orchestrator's view of one candidate."""

    state: MemberState | None = None
    meta: MemberMeta | None = None
    available_reported: bool = False

    @property
    def complete(self) -> bool:
        meta = self.meta
        return (
            self.state is MemberState.Alive
            and meta is not None
            and meta.boot_health is not BootHealth.Unavailable
            and (self.available_reported or meta.boot_health is BootHealth.Available)
            and meta.has_endpoint
        )

    @property
    def lost(self) -> bool:
        """Gone from the pool: dead, left, removed, or its boot health unavailable."""
        return (self.state in (MemberState.Dead, MemberState.Left, None)
                or (self.meta is not None and self.meta.boot_health is BootHealth.Unavailable))


class PoolReadiness(pr.PoolReadinessEffects[None]):
    """The `pool_readiness` binding (see the module docstring): its guards, its effects,
    and its convergence timer (a deadline the caller's clock passes, `tick`)."""

    def __init__(self, candidates: Collection[NodeId], convergence_window_s: float, *,
                 observer: NodeId, emitter: Emitter | None = None) -> None:
        if not candidates:
            raise ValueError("PoolReadiness: the intended candidate pool is empty")
        if convergence_window_s < 0:
            raise ValueError(f"PoolReadiness: negative convergence window {convergence_window_s}")
        self.candidates = frozenset(candidates)
        self.views = {node: CandidateView() for node in self.candidates}
        self.observer = observer
        self._emitter = emitter
        self.convergence_window_s = convergence_window_s
        self._machine = pr.PoolReadinessMachine(self, convergence_window_s=convergence_window_s)
        self._host = MachineHost(self._machine, pr.bind(self), timers=self,
                                 timer_events=pr.TIMER_EVENTS)
        self._deadline = float("inf")
        self._now = 0.0
        """The caller's clock at the input being handled (timers and outcomes read it)."""
        self._outcomes: list[Outcome] = []

    # ------------------------------------------------------------ inputs

    def observe(self, event: MembershipEvent, now: float) -> None:
        """Feed one event of the orchestrator's SWIM participant."""
        if not isinstance(event, MemberChanged) or event.node_id not in self.candidates:
            return
        view = self.views[event.node_id]
        view.state = None if event.state is MemberState.Removed else event.state
        if event.meta is not None:
            view.meta = event.meta
        self._changed(event.node_id, now)

    def node_available(self, node: NodeId, now: float) -> None:
        """A candidate reported NodeAvailable over the control plane."""
        if node in self.candidates and not self.views[node].available_reported:
            self.views[node].available_reported = True
            self._changed(node, now)

    def tick(self, now: float) -> None:
        """Fire the convergence window if its deadline passed."""
        if now >= self._deadline:
            self._deadline = float("inf")
            self._feed(pr.ConvergenceWindowElapsed(), now)

    def plan_committed(self, run: RunId, now: float) -> None:
        self._feed(pr.RunPlanCommitted(run_id=run), now)

    def run_ended(self, run: RunId, now: float) -> None:
        self._feed(pr.RunEnded(run_id=run), now)

    def abort(self, now: float) -> None:
        self._feed(pr.AbortWaiting(), now)

    # ------------------------------------------------------------ outputs

    @property
    def state(self) -> pr.State:
        return self._machine.state

    @property
    def ready(self) -> bool:
        return self._machine.state in (pr.State.PoolReady, pr.State.Committed)

    def next_deadline(self) -> float:
        return self._deadline

    def take_outcomes(self) -> list[Outcome]:
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    # ------------------------------------------------------------ guard

    def pool_complete(self, event: pr.MemberChanged) -> bool:
        return all(view.complete for view in self.views.values())

    def candidate_lost(self, event: pr.MemberChanged) -> bool:
        return self.views[event.node_id].lost

    # ------------------------------------------------------------ timers (host's Timers)

    def start(self, name: str, seconds: float, message: pr.Event) -> None:
        self._deadline = self._now + seconds  # the one timer: ConvergenceWindowElapsed

    def cancel(self, name: str) -> None:
        self._deadline = float("inf")

    # ------------------------------------------------------------ effects

    def report_pool_ready(self) -> None:
        emitter = self._emitter or default_emitter()
        emitter.emit(PoolReady(node_id=self.observer, detail={
            "candidates": len(self.candidates),
            "convergence_window_s": self.convergence_window_s,
            "gate": "pool_readiness"}))
        self._outcomes.append(PoolReadyReached(self._now))

    def report_pool_readiness_lost(self) -> None:
        self._outcomes.append(ReadinessLost(self._now))

    def report_membership_lost(self, node_id: NodeId) -> None:
        self._outcomes.append(MembershipLost(node_id, self._now))

    def report_pool_aborted(self) -> None:
        self._outcomes.append(WaitingAborted(self._now))

    # ------------------------------------------------------------ internals

    def _changed(self, node: NodeId, now: float) -> None:
        self._feed(pr.MemberChanged(node_id=node), now)

    def _feed(self, event: pr.Event, now: float) -> None:
        self._now = now
        self._host.feed(event)


async def wait_pool_ready(
    events: asyncio.Queue[MembershipEvent],
    readiness: PoolReadiness,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> PoolReadyReached:
    """Feed `events` (from `udp.asyncio_events`) into `readiness` until PoolReady.

    Raises `TimeoutError` naming the candidates still incomplete.
    """
    give_up = clock() + timeout_s
    while True:
        for outcome in readiness.take_outcomes():
            if isinstance(outcome, PoolReadyReached):
                return outcome
        now = clock()
        if now >= give_up:
            missing = sorted(int(n) for n, v in readiness.views.items() if not v.complete)
            raise TimeoutError(f"pool not ready after {timeout_s}s; incomplete: {missing}"
                               if missing else f"pool not stable for the window in {timeout_s}s")
        wait = min(readiness.next_deadline(), give_up) - now
        try:
            event = await asyncio.wait_for(events.get(), max(0.0, wait))
        except TimeoutError:
            readiness.tick(clock())
            continue
        readiness.observe(event, clock())
        readiness.tick(clock())
