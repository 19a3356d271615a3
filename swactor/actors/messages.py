"""Messages the runtime itself delivers to actors.

`Terminated` is what a watcher receives, in its ordinary mailbox and in order with its
other mail, when a watched actor ends: `reason` says whether it was stopped or crashed,
and `error` holds the exception of a crash. An actor that watches others must accept
`Terminated` in its message type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.actors.address import Address


class StopReason(enum.Enum):
    """Why an actor ended."""

    Stopped = "stopped"
    """Stopped on request (by itself, its parent, a `stop()` call or runtime shutdown)."""
    Crashed = "crashed"
    """Its handler raised and its supervisor stopped it (directly or after restarts)."""


@dataclass(frozen=True, slots=True)
class Terminated:
    """A watched actor has ended; delivered to every watcher."""

    address: Address
    reason: StopReason
    error: BaseException | None = None
