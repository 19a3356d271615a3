"""`WakeWatch`: the orchestrator's waits on its token rings, woken by the driver's hints.

Theory of operation. The orchestrator's token-out reader sleeps until the driver's recv
pump commits bytes into the token-out ring, and `inject` sleeps on a full token-in ring
until the driver's send pump consumes some. Both are woken by the driver's wake hints
(spec §21): the ring's side that publishes marks the readable (writable) pending bit and
sends a hint only when the bit was clear; the waiter clears the bit *before* it
re-checks the cursors and sleeps only if there is still nothing to do. In this process
the hint is a synchronous call (driver -> `WakeFanout` -> `LocalRingInstaller.wake`, which
sets the waiter's `asyncio.Event`), so a waiter that followed that order cannot miss
one, and `wait` has no timeout: a slow token costs no wake-up.

A hint that is lost anyway (a bug on the hint path) would leave the pending bit set, so
that no later commit sends another: the ring would stall for good. `WakeWatch` is the
safety net under that: while anything waits, one timer per `period` (not one per
wait) asks each waiter whose event is still clear whether its ring has work for it
(`work`: committed bytes, room, or a state change). Since hints are synchronous, work
found with the event clear is a lost hint: it is counted in `lost`, logged, and the
waiter woken, so the run goes on instead of stalling until its step timer faults it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("swactor.orchestrator.wake_watch")

WATCH_S = 1.0
"""Seconds between the safety net's checks while anything waits: the most a lost hint
delays its ring (a hint is never expected to be lost)."""


class WakeWatch:
    """Event-driven waits on ring wake events with a periodic lost-hint check (module doc)."""

    def __init__(self, period: float = WATCH_S) -> None:
        self.period = period
        self.lost = 0
        """Waits the check ended because work was there and no hint had come."""
        self._waiting: dict[asyncio.Event, tuple[str, Callable[[], bool]]] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self, wake: asyncio.Event, work: Callable[[], bool], what: str) -> None:
        """Until `wake` is set (the driver's hint, or the check when `work()` says the
        ring has work and no hint came). `what` names the waiter in the log."""
        if wake.is_set():
            return
        self._waiting[wake] = (what, work)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.period, self._check)
        try:
            await wake.wait()
        finally:
            self._waiting.pop(wake, None)

    def _check(self) -> None:
        self._timer = None
        for wake, (what, work) in list(self._waiting.items()):
            if not wake.is_set() and work():
                self.lost += 1
                log.warning("%s: its ring had work and no wake hint came; woken by the check",
                            what)
                wake.set()
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(self.period, self._check)

    def close(self) -> None:
        """Cancel the check (the waiters themselves are cancelled by their owners)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


__all__ = ["WATCH_S", "WakeWatch"]
