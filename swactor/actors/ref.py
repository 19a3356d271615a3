"""`ActorRef`: the handle through which everyone else talks to an actor.

A ref is typed by the messages the actor accepts, contravariantly: an
`ActorRef[A | B | C]` may be passed where an `ActorRef[A | B]` is expected (an owner
that accepts more than a child reports is a fine owner), and an `ActorRef[Never]` is a
ref to any actor, one that stops or watches it but tells it nothing. `tell` never
blocks and never drops a message for a live actor (mail for a terminated one is counted
as a dead letter and `tell` returns False); `await send` is the same but waits while the
mailbox is at its capacity, which is how bulk producers get backpressure. `ask` sends a
message with a reply slot and waits for the handler's `ctx.reply(...)`, with a timeout.
`stop` asks the actor to end after its current message; `join` waits for its
`Terminated` record.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from swactor.actors.address import Address
from swactor.actors.errors import ActorNotAlive, AskTimeout, UnexpectedReply
from swactor.actors.mailbox import MailboxClosed
from swactor.actors.messages import Terminated

if TYPE_CHECKING:
    from swactor.actors.cell import ActorCell

M = TypeVar("M", contravariant=True)
R = TypeVar("R")


class ActorRef(Generic[M]):
    """A typed handle to one actor."""

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell[M]) -> None:
        self._cell = cell

    @property
    def address(self) -> Address:
        return self._cell.address

    @property
    def alive(self) -> bool:
        """True until the actor has begun terminating."""
        return self._cell.accepting

    def __repr__(self) -> str:
        return f"ActorRef({self._cell.address})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorRef) and other._cell is self._cell

    def __hash__(self) -> int:
        return hash(self._cell.address)

    def tell(self, message: M, sender: Address | None = None) -> bool:
        """Enqueue `message` now; False (and a dead letter) if the actor has ended."""
        return self._cell.post_message(message, sender)

    async def send(self, message: M, sender: Address | None = None) -> None:
        """Enqueue once the mailbox is below capacity; ActorNotAlive if it has ended."""
        try:
            await self._cell.put_message(message, sender)
        except MailboxClosed:
            raise ActorNotAlive(self.address, f"send {type(message).__name__}") from None

    @overload
    async def ask(self, message: M, timeout: float) -> Any: ...

    @overload
    async def ask(self, message: M, timeout: float, expect: type[R]) -> R: ...

    async def ask(self, message: M, timeout: float, expect: type[Any] | None = None) -> Any:
        """Send `message` and wait up to `timeout` s for the handler's reply.

        Raises AskTimeout, ActorNotAlive (ended before replying), ActorCrashed (the handler
        raised), NoReply (the handler returned without replying) or UnexpectedReply (the
        reply is not an instance of `expect`).
        """
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._cell.post_message(message, None, reply):
            raise ActorNotAlive(self.address, f"ask {type(message).__name__}")
        try:
            async with asyncio.timeout(timeout):
                value = await reply
        except TimeoutError:
            reply.cancel()
            raise AskTimeout(self.address, type(message).__name__, timeout) from None
        if expect is not None and not isinstance(value, expect):
            raise UnexpectedReply(self.address, expect.__name__, type(value).__name__)
        return value

    def stop(self) -> None:
        """Ask the actor to stop after its current message. Idempotent."""
        self._cell.request_stop()

    async def join(self) -> Terminated:
        """Wait until the actor has terminated."""
        return await asyncio.shield(self._cell.terminated)

    async def stop_and_join(self) -> Terminated:
        self.stop()
        return await self.join()
