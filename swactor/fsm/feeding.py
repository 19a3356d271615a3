"""`EventFeeder`: run-to-completion feeding of one generated machine by its binding.

Theory of operation
-------------------
A binding (a pump, a ring record, the worker process) hands its machine one event at a
time and carries out each effect the machine returns. Carrying out an effect may feed
the machine again (a check that finds bytes feeds `RingReadable`, a failed send feeds
`TransportFailed`, ...). Such an event must not re-enter `handle()` while the effects of
the current one are still being carried out, or effects would interleave out of table
order. So `feed` appends to a queue; only the outermost call drains it, handing each
event to the machine and carrying out all its effects before the next event. If
carrying out an effect raises, the exception propagates to the outermost caller, the
feeder is ready for the next `feed`, and events still queued stay queued: they are
handled first by that next `feed`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

E = TypeVar("E")
F = TypeVar("F")


class EventFeeder(Generic[E, F]):
    """Feeds `handle` (a machine's) events in order; `carry_out` gets every effect."""

    __slots__ = ("_carry_out", "_feeding", "_handle", "_queue")

    def __init__(self, handle: Callable[[E], Iterable[F]], carry_out: Callable[[F], None]
                 ) -> None:
        self._handle = handle
        self._carry_out = carry_out
        self._queue: deque[E] = deque()
        self._feeding = False

    def feed(self, event: E) -> None:
        """Apply `event`; events fed while its effects are carried out queue behind it."""
        self._queue.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._queue:
                for effect in self._handle(self._queue.popleft()):
                    self._carry_out(effect)
        finally:
            self._feeding = False
