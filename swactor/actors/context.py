"""`Context`: what a running actor can do, handed to every hook and handler.

The context is the actor's view of the runtime: its own ref and address, the sender of
the current message, replies to asks, children (spawn, stop), watches, named timers, and
tasks owned by the actor (cancelled when the incarnation ends; a task that raises fails
the actor like a raising handler would).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, Never, TypeVar

from swactor.actors.actor import Actor
from swactor.actors.address import Address
from swactor.actors.ref import ActorRef
from swactor.actors.supervision import SupervisorStrategy
from swactor.actors.timers import Timers

if TYPE_CHECKING:
    from swactor.actors.cell import ActorCell
    from swactor.actors.runtime import Runtime

M = TypeVar("M")
N = TypeVar("N")
T = TypeVar("T")


class Reply:
    """A pending answer to one ask; may be kept and completed later."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[Any] | None) -> None:
        self._future = future

    @property
    def expected(self) -> bool:
        """True while an asker is still waiting for this reply."""
        return self._future is not None and not self._future.done()

    def send(self, value: object) -> bool:
        """Complete the ask with `value`; False if nobody waits (tell, timed out, done)."""
        if not self.expected:
            return False
        assert self._future is not None
        self._future.set_result(value)
        return True

    def fail(self, error: BaseException) -> bool:
        """Complete the ask with an exception raised at the asker."""
        if not self.expected:
            return False
        assert self._future is not None
        self._future.set_exception(error)
        return True


class Context(Generic[M]):
    """The running actor's handle on the runtime."""

    def __init__(self, cell: ActorCell[M]) -> None:
        self._cell = cell

    @property
    def self_ref(self) -> ActorRef[M]:
        return self._cell.ref

    @property
    def address(self) -> Address:
        return self._cell.address

    @property
    def runtime(self) -> Runtime:
        return self._cell.runtime

    @property
    def parent(self) -> ActorRef[Any] | None:
        """The parent actor, or None for a top-level actor."""
        parent = self._cell.parent
        return None if parent is None else parent.ref

    @property
    def sender(self) -> Address | None:
        """The sender of the message being handled (None: not an actor, or a timer)."""
        return self._cell.current_sender

    @property
    def timers(self) -> Timers[M]:
        """Named timers whose messages arrive in this actor's mailbox."""
        return self._cell.timers

    @property
    def children(self) -> list[ActorRef[Any]]:
        return [child.ref for child in self._cell.children.values()]

    def tell(self, target: ActorRef[N], message: N) -> bool:
        """Send `message` to `target` with this actor as its sender."""
        return target.tell(message, self._cell.address)

    def reply(self, value: object) -> bool:
        """Answer the ask being handled; False if the current message was not an ask."""
        return self._cell.current_reply.send(value)

    def reply_later(self) -> Reply:
        """Take the current ask's reply slot to answer after the handler returns."""
        return self._cell.defer_reply()

    def spawn(
        self,
        factory: Callable[[], Actor[N]],
        name: str | None = None,
        *,
        strategy: SupervisorStrategy | None = None,
        mailbox_capacity: int | None = None,
    ) -> ActorRef[N]:
        """Start a child actor supervised by `strategy` (default: stop on failure)."""
        return self._cell.spawn_child(factory, name, strategy, mailbox_capacity)

    def stop(self, target: ActorRef[Never]) -> None:
        """Ask `target` to stop after its current message."""
        target.stop()

    def stop_self(self) -> None:
        """End this actor once the current handler returns."""
        self._cell.request_stop()

    def watch(self, target: ActorRef[Never]) -> None:
        """Receive `Terminated(target...)` when `target` ends (at once if it already has).

        The watching actor's message type must include `Terminated`.
        """
        self._cell.watch(target)

    def unwatch(self, target: ActorRef[Never]) -> None:
        self._cell.unwatch(target)

    def spawn_task(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run `coro` as a task owned by this incarnation (see the module docstring)."""
        return self._cell.spawn_task(coro, name)
