"""Named timers that fire as ordinary messages.

State machines see time as events: a generated machine emits `StartTimer(name, seconds)`
and `CancelTimer(name)` effects, its binding calls `ctx.timers.start(name, seconds,
message)` / `ctx.timers.cancel(name)`, and when the timer fires `message` arrives in the
actor's mailbox like any other mail, in order with it.

`apply(effect, TIMER_EVENTS)` does this in one call for a generated machine: it carries
out a `StartTimer`/`CancelTimer` effect (building the timer's event from the generated
module's `TIMER_EVENTS` table) and returns False for every other effect.

Each start gets a fresh generation number. Firing does not deliver the message directly:
it enqueues a `TimerFired(name, generation)` marker, and the actor's run loop asks
`claim(name, generation)` when it reaches the marker. A timer cancelled or restarted
after it fired but before its marker was handled therefore delivers nothing: after
`cancel(name)` returns, that timer's message is never handled. Starting a name that is
already active replaces it. All timers of an incarnation are cancelled when it stops or
restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from swactor.fsm.runtime import CancelTimer, StartTimer

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class TimerFired:
    """Mailbox marker for a fired timer; resolved by `Timers.claim`."""

    name: str
    generation: int


@dataclass(slots=True)
class _Armed(Generic[M]):
    generation: int
    message: M
    interval_s: float | None
    handle: asyncio.TimerHandle


class Timers(Generic[M]):
    """The named timers of one actor incarnation."""

    def __init__(self, post: Callable[[TimerFired], None]) -> None:
        self._post = post
        self._armed: dict[str, _Armed[M]] = {}
        self._generation = 0

    def start(self, name: str, seconds: float, message: M, *, repeat: bool = False) -> None:
        """Deliver `message` after `seconds` (and every `seconds` if `repeat`)."""
        if seconds < 0:
            raise ValueError(f"timer {name!r}: negative delay {seconds}")
        self.cancel(name)
        self._generation += 1
        generation = self._generation
        handle = asyncio.get_running_loop().call_later(
            seconds, self._fire, name, generation
        )
        self._armed[name] = _Armed(generation, message, seconds if repeat else None, handle)

    def cancel(self, name: str) -> bool:
        """Cancel the named timer; True if it was active."""
        armed = self._armed.pop(name, None)
        if armed is None:
            return False
        armed.handle.cancel()
        return True

    def apply(self, effect: object, timer_events: Mapping[str, Callable[[], M]]) -> bool:
        """Carry out a machine's StartTimer/CancelTimer effect; False for other effects."""
        if isinstance(effect, StartTimer):
            make = timer_events.get(effect.name)
            if make is None:
                raise KeyError(f"StartTimer({effect.name!r}): no such timer event")
            self.start(effect.name, effect.seconds, make())
            return True
        if isinstance(effect, CancelTimer):
            self.cancel(effect.name)
            return True
        return False

    def cancel_all(self) -> None:
        for name in list(self._armed):
            self.cancel(name)

    def active(self, name: str) -> bool:
        return name in self._armed

    def claim(self, fired: TimerFired) -> tuple[bool, M | None]:
        """At dequeue time: (True, message) if this firing is still current."""
        armed = self._armed.get(fired.name)
        if armed is None or armed.generation != fired.generation:
            return False, None
        if armed.interval_s is None:
            del self._armed[fired.name]
        return True, armed.message

    def _fire(self, name: str, generation: int) -> None:
        armed = self._armed.get(name)
        if armed is None or armed.generation != generation:
            return
        if armed.interval_s is not None:
            armed.handle = asyncio.get_running_loop().call_later(
                armed.interval_s, self._fire, name, generation
            )
        self._post(TimerFired(name, generation))
