"""Typed errors of the actor runtime.

Every failure the runtime reports to a caller is one of these classes, each naming the
actor address and the problem, so that callers and tests can match on the type instead of
parsing text. `AskTimeout` is also a `TimeoutError`, so generic timeout handling still
works.
"""

from __future__ import annotations

from swactor.actors.address import Address


class ActorError(Exception):
    """Base of every actor runtime error."""


class InvalidActorName(ActorError):
    """A spawn named an actor with an empty, slashed or duplicate sibling name."""


class ActorNotAlive(ActorError):
    """A message was sent to, or asked of, an actor that has terminated."""

    def __init__(self, address: Address, what: str) -> None:
        super().__init__(f"{address}: actor is not alive ({what})")
        self.address = address


class AskTimeout(ActorError, TimeoutError):
    """An ask got no reply within its timeout."""

    def __init__(self, address: Address, message_type: str, timeout_s: float) -> None:
        super().__init__(f"{address}: no reply to {message_type} within {timeout_s:g} s")
        self.address = address
        self.message_type = message_type
        self.timeout_s = timeout_s


class NoReply(ActorError):
    """The handler returned without replying to an ask and without deferring the reply."""

    def __init__(self, address: Address, message_type: str) -> None:
        super().__init__(f"{address}: handler for {message_type} returned without a reply")
        self.address = address
        self.message_type = message_type


class UnexpectedReply(ActorError):
    """An ask got a reply of another type than the caller expected."""

    def __init__(self, address: Address, expected: str, got: str) -> None:
        super().__init__(f"{address}: expected a {expected} reply, got {got}")
        self.address = address


class ActorCrashed(ActorError):
    """The actor raised while handling an ask; the original exception is `__cause__`."""

    def __init__(self, address: Address, error: BaseException) -> None:
        super().__init__(f"{address}: crashed: {type(error).__name__}: {error}")
        self.address = address
        self.error = error


class ChildFailed(ActorError):
    """Raised inside a parent when a child's supervisor escalated the child's failure."""

    def __init__(self, child: Address, error: BaseException) -> None:
        super().__init__(f"child {child} failed: {type(error).__name__}: {error}")
        self.child = child
        self.error = error


class RestartBudgetExhausted(ActorError):
    """A restarting actor failed more often than its strategy allows; it was stopped."""

    def __init__(self, address: Address, restarts: int, within_s: float) -> None:
        super().__init__(f"{address}: more than {restarts} restarts within {within_s:g} s")
        self.address = address
