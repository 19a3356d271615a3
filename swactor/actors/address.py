"""Actor addresses.

An `Address` names one incarnation-independent actor for its whole life: a slash path
from the runtime root (`/node/edges/tx-7`) plus a uid unique within the process, so that a
new actor spawned later under the same path never receives mail meant for an old one.
Addresses are plain values: hashable, comparable, printable; they hold no reference to
the actor itself (that is what `ActorRef` is for).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Address:
    """Where an actor lives: its path and a process-unique uid."""

    path: str
    uid: int

    def __str__(self) -> str:
        return f"{self.path}#{self.uid}"

    @property
    def name(self) -> str:
        """The last path segment: the name the actor was spawned with."""
        return self.path.rsplit("/", 1)[-1]
