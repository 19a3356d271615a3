"""Shared runtime pieces of every generated protocol machine.

Theory of operation
-------------------
Each table in ``fsm/*.yaml`` becomes a module under ``swactor.fsm.generated`` whose
machine class has one entry point, ``handle(event) -> list[Effect]``. The pieces that
are the same for every machine live here so that bindings can treat them uniformly:

* ``ProtocolError`` is raised by ``handle()`` when a table's ``unhandled: raise`` policy
  meets an event that no row of the current state handles, or when the object handed
  in is not an event of that machine at all. The machine's state is unchanged.
* ``StartTimer`` / ``CancelTimer`` are built-in effects: a row entering a state that
  declares a ``timer`` emits ``StartTimer(name, seconds)``; a row leaving it emits
  ``CancelTimer(name)``. ``name`` is the name of the timer's event class; the generated
  module's ``TIMER_EVENTS[name]()`` builds the event the binding feeds back through
  ``handle()`` when the timer fires. Machines never read a clock.
* ``ProtocolViolation`` is the built-in effect of the ``unhandled: fault`` policy: the
  machine moves to its fault state and reports which event arrived in which state.

Effects are frozen slotted dataclasses, compared by value in tests. Each generated
module also declares its effects port, ``<Prefix>Effects``: a Protocol generic in
``Result`` with one method per table effect (the effect's fields as arguments), which a
binding implements and ``bind(port)`` maps effect classes onto; ``swactor.fsm.host``
feeds the machine and calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Never, TypeVar

__all__ = [
    "CancelTimer",
    "ProtocolError",
    "ProtocolViolation",
    "R",
    "Result",
    "StartTimer",
    "blank",
    "on_effect",
    "slot_setter",
]

Result = TypeVar("Result", covariant=True)
"""What an effects port's methods return: ``None`` for a binding whose host calls them
synchronously, an awaitable for one whose host awaits each (``swactor.fsm.host``)."""

R = TypeVar("R")
"""``Result`` as a generated ``bind(port)`` passes it through."""

_E = TypeVar("_E")

blank: Callable[[type[Any]], Any] = object.__new__
"""An instance of a slotted class with no slot set yet; generated effect builders fill
every slot with ``slot_setter`` setters right after (no ``__init__`` frame)."""


def on_effect(
    effect: type[_E], call: Callable[[_E], R]
) -> tuple[type[object], Callable[[Never], R]]:
    """One entry of a generated ``bind(port)``: ``effect`` and the port call for it.

    ``call`` is type-checked against ``effect`` (so it reads fields the effect has and
    passes them where the port method wants them); the entry forgets the class, since a
    host looks its entries up by ``type(effect)`` and so calls each only with its own.
    """
    return effect, call


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of slot ``name`` of ``cls``, bypassing a frozen dataclass's __setattr__.

    Generated frozen dataclasses store their fields in ``__init__`` through these: one C
    call per field instead of ``object.__setattr__`` through the dataclass machinery.
    """
    setter: Callable[[Any, Any], None] = cls.__dict__[name].__set__
    return setter


class ProtocolError(Exception):
    """An event arrived that the machine's table does not allow in its current state."""

    def __init__(self, machine: str, state: str, event: str, reason: str) -> None:
        self.machine = machine
        """Table name of the machine, e.g. ``arena_manager``."""
        self.state = state
        """Name of the state the machine was in (and still is)."""
        self.event = event
        """Class name of the rejected event."""
        self.reason = reason
        """Why it was rejected."""
        super().__init__(f"{machine}: event {event} in state {state}: {reason}")


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Arm the timer ``name`` to fire once after ``seconds`` (replacing any armed one)."""

    name: str
    """Timer name: the class name of the event to feed back when it fires."""
    seconds: float
    """Delay from now, in seconds."""


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Disarm the timer ``name``; a no-op for the binding if it already fired."""

    name: str
    """Timer name: the class name of the timer's event."""


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """An event that no row handles arrived; the machine moved to its fault state."""

    machine: str
    """Table name of the machine."""
    state: str
    """Name of the state in which the unexpected event arrived."""
    event: str
    """Class name of the unexpected event (its payload is never reported)."""
