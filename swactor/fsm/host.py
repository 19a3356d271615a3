"""The one host of every generated machine: feed events, run timers, dispatch effects.

Theory of operation
-------------------
A binding is a ledger (the facts its guards read) plus one method per effect: it
implements its table's ``<Prefix>Guards`` and ``<Prefix>Effects`` protocols, and a host
does the rest. ``MachineHost`` (a binding that carries effects out at once) and
``AsyncMachineHost`` (one whose effect methods are coroutines, awaited in turn) both

* hand the machine one event at a time, run to completion: an event fed while the
  effects of the current one are being carried out (an effect method that feeds the
  host, a rejection hook that feeds a fallback event) queues behind it and is handled
  after every effect of the current event, so effects never interleave out of table
  order. Only the outermost ``feed`` drains the queue. If carrying out an effect
  raises, the exception reaches that caller; events still queued stay queued and are
  handled first by the next ``feed``;
* apply the table's unhandled-event policy: ``raise`` surfaces as the machine's
  ``ProtocolError``, handed to the binding's ``rejected(event, error)`` hook when it
  gave one (else raised to the caller); ``ignore`` costs nothing; ``fault`` moves the
  machine to its fault state and the ProtocolViolation effect reaches the port's
  ``protocol_violation`` like any other effect;
* carry out ``StartTimer`` / ``CancelTimer`` on the binding's ``Timers`` (an actor's
  ``ctx.timers``, or any object with ``start``/``cancel``): the timer's message is
  ``timer_events[name]()``, which the timer delivers back to the binding, which feeds
  it like any other event;
* call the port method ``bind(port)`` maps each other effect class to, with the effect's
  fields as arguments.

A timer effect of a machine whose host was given no timers raises ``RuntimeError``: a
table with timers needs a binding that runs them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Never, Protocol, TypeVar

from swactor.fsm.runtime import CancelTimer, ProtocolError, StartTimer

__all__ = ["AsyncMachineHost", "Machine", "MachineHost", "Rejected", "Timers"]

E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)


class Machine(Protocol[E_contra]):
    """A generated machine: ``handle(event)`` returns the effects to carry out."""

    def handle(self, event: E_contra, /) -> list[Any]: ...


class Timers(Protocol[E_contra]):
    """Named one-shot timers that deliver ``message`` to the binding when they fire."""

    def start(self, name: str, seconds: float, message: E_contra) -> None: ...

    def cancel(self, name: str) -> object: ...


Rejected = Callable[[E, ProtocolError], None]
"""``rejected(event, error)``: the binding's answer to an event its table refuses."""


class _HostBase(Generic[E]):
    __slots__ = ("_feeding", "_handle", "_queue", "_rejected", "_timer_events", "timers")

    def __init__(
        self,
        machine: Machine[E],
        *,
        timers: Timers[E] | None,
        timer_events: Mapping[str, Callable[[], E]] | None,
        rejected: Rejected[E] | None,
    ) -> None:
        self._handle = machine.handle
        self.timers = timers
        """Where StartTimer/CancelTimer go; a binding may set it once it has them."""
        self._timer_events = timer_events or {}
        self._rejected = rejected
        self._queue: deque[E] = deque()
        self._feeding = False

    def _effects(self, event: E) -> list[Any]:
        """The machine's effects for `event`; [] when `rejected` took its ProtocolError."""
        if self._rejected is None:
            return self._handle(event)
        try:
            return self._handle(event)
        except ProtocolError as error:
            self._rejected(event, error)
            return []

    def _timer(self, effect: StartTimer | CancelTimer) -> None:
        timers = self.timers
        if timers is None:
            raise RuntimeError(f"{type(effect).__name__}({effect.name!r}): the host of this "
                               "machine was given no timers")
        if type(effect) is StartTimer:
            make = self._timer_events.get(effect.name)
            if make is None:
                raise KeyError(f"StartTimer({effect.name!r}): no such timer event")
            timers.start(effect.name, effect.seconds, make())
        else:
            timers.cancel(effect.name)


class MachineHost(_HostBase[E]):
    """Hosts one machine for a binding whose effect methods return ``None`` (module doc)."""

    __slots__ = ("_dispatch",)

    def __init__(
        self,
        machine: Machine[E],
        dispatch: Mapping[type[object], Callable[[Never], None]],
        *,
        timers: Timers[E] | None = None,
        timer_events: Mapping[str, Callable[[], E]] | None = None,
        rejected: Rejected[E] | None = None,
    ) -> None:
        """`dispatch` is the generated ``bind(port)`` of the machine's module."""
        super().__init__(machine, timers=timers, timer_events=timer_events,
                         rejected=rejected)
        self._dispatch: dict[type[object], Callable[[Never], None]] = {
            **dispatch, StartTimer: self._timer, CancelTimer: self._timer}

    def feed(self, event: E) -> None:
        """Apply `event` and carry out its effects; see the module doc for the order."""
        self._queue.append(event)
        if self._feeding:
            return
        self._feeding = True
        dispatch = self._dispatch
        try:
            while self._queue:
                for effect in self._effects(self._queue.popleft()):
                    dispatch[type(effect)](effect)
        finally:
            self._feeding = False


class AsyncMachineHost(_HostBase[E]):
    """Hosts one machine for a binding whose effect methods are coroutines (module doc)."""

    __slots__ = ("_dispatch",)

    def __init__(
        self,
        machine: Machine[E],
        dispatch: Mapping[type[object], Callable[[Never], Awaitable[None]]],
        *,
        timers: Timers[E] | None = None,
        timer_events: Mapping[str, Callable[[], E]] | None = None,
        rejected: Rejected[E] | None = None,
    ) -> None:
        """`dispatch` is the generated ``bind(port)`` of the machine's module."""
        super().__init__(machine, timers=timers, timer_events=timer_events,
                         rejected=rejected)
        self._dispatch = dispatch

    async def feed(self, event: E) -> None:
        """Apply `event` and await its effects in order; an event fed meanwhile (by an
        effect, or by another task) queues behind it and this call handles it too."""
        self._queue.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._queue:
                for effect in self._effects(self._queue.popleft()):
                    if type(effect) is StartTimer or type(effect) is CancelTimer:
                        self._timer(effect)
                    else:
                        await self._dispatch[type(effect)](effect)
        finally:
            self._feeding = False
