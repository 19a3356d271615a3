"""The `Actor` base class: what a user writes.

An actor is a class with one required coroutine, `receive(ctx, message)`, called with one
message at a time, in mailbox order; it never runs concurrently with itself, so its fields
need no locks. `started(ctx)` runs before the first message of every incarnation and
`stopped(ctx)` after the last one (also before a restart); `cancelled(ctx)`, synchronous,
replaces `stopped` when a forced shutdown cancels the actor. The runtime builds instances
from a factory (usually the class itself), so a restart gets fresh state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from swactor.actors.context import Context

M = TypeVar("M")


class Actor(Generic[M]):
    """Base class of every actor; `M` is the type of message its mailbox accepts."""

    async def started(self, ctx: Context[M]) -> None:
        """Called once per incarnation, before the first message."""

    async def receive(self, ctx: Context[M], message: M) -> None:
        """Handle one message. Raising hands the failure to the supervisor."""
        raise NotImplementedError(f"{type(self).__name__} does not implement receive()")

    async def stopped(self, ctx: Context[M]) -> None:
        """Called once per incarnation after its last message (stop, crash or restart)."""

    def cancelled(self, ctx: Context[M]) -> None:
        """Called instead of `stopped` when a forced shutdown cancels the actor: no awaits.

        Release what must not outlive the process (kill a child process, say).
        """
