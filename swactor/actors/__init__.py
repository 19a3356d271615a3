"""swactor's asyncio actor runtime: addresses, mailboxes, supervision, timers, processes.

Theory of operation. An actor is an object with a typed mailbox and a handler that the
runtime calls with one message at a time (`cell` runs one asyncio task per actor).
Everything else talks to it through an `ActorRef`: `tell` (never blocks, never drops),
`await send` (waits while the mailbox is at capacity: backpressure for bulk producers),
`await ask(msg, timeout)` (the handler answers with `ctx.reply`). Mail from one sender
arrives in the order sent. Actors spawn children, `watch` others (an ended actor's
watchers get a `Terminated` message), and set named timers whose messages arrive in the
same mailbox. A handler that raises is handed to its supervisor strategy (stop, restart,
escalate); the runtime itself never dies of it. `process.ProcessActor` wraps one child
process: it reports `Started`, `Line` and `Exited` to its owner and leaves no orphan.

The normal shape of an actor is a generated state machine plus a binding: the binding
translates mail into machine events and implements the table's effects port, one method
per effect; a host (`swactor.fsm.host`) feeds the pure `machine.handle()` and calls
those methods, timers included::

    from swactor.actors import Actor, Context, Runtime
    from swactor.fsm.generated import arena_manager as am
    from swactor.fsm.host import MachineHost

    class ArenaManagerActor(Actor[am.Event], am.ArenaManagerEffects[None]):
        async def started(self, ctx: Context[am.Event]) -> None:
            self.ctx = ctx
            machine = am.ArenaManagerMachine(guards=self, ...)   # self implements
                                                                 # ArenaManagerGuards
            self.host = MachineHost(machine, am.bind(self), timers=ctx.timers,
                                    timer_events=am.TIMER_EVENTS)

        async def receive(self, ctx: Context[am.Event], message: am.Event) -> None:
            self.host.feed(message)        # pure machine; the host calls the effects

        def create_arena(self, ceiling: int) -> None:
            ...   # memfd, ftruncate, mmap; then self.ctx.self_ref.tell(
                  # am.ArenaConstructed(...)) feeds the result back in

        def ring_leased(self, request_id, requester, edge_id, direction, ring_spec) -> None:
            self.ctx.reply(...)
        ...   # one method per effect: mypy --strict refuses a missing one

    async def main() -> None:
        async with Runtime("node") as runtime:
            arena = runtime.spawn(ArenaManagerActor, "arena")
            arena.tell(am.ConstructArena(...))
            leased = await arena.ask(am.LeaseRing(...), timeout=2.0)

A raise inside `receive` (a `ProtocolError` from `handle()`, say) is a failure of this
actor alone; its supervisor decides what happens next.
"""

from swactor.actors.actor import Actor
from swactor.actors.address import Address
from swactor.actors.context import Context, Reply
from swactor.actors.errors import (
    ActorCrashed,
    ActorError,
    ActorNotAlive,
    AskTimeout,
    ChildFailed,
    InvalidActorName,
    NoReply,
    RestartBudgetExhausted,
    UnexpectedReply,
)
from swactor.actors.mailbox import Mailbox, MailboxClosed
from swactor.actors.messages import StopReason, Terminated
from swactor.actors.ref import ActorRef
from swactor.actors.runtime import Runtime
from swactor.actors.supervision import Directive, SupervisorStrategy
from swactor.actors.timers import Timers

__all__ = [
    "Actor",
    "ActorCrashed",
    "ActorError",
    "ActorNotAlive",
    "ActorRef",
    "Address",
    "AskTimeout",
    "ChildFailed",
    "Context",
    "Directive",
    "InvalidActorName",
    "Mailbox",
    "MailboxClosed",
    "NoReply",
    "Reply",
    "RestartBudgetExhausted",
    "Runtime",
    "StopReason",
    "SupervisorStrategy",
    "Terminated",
    "Timers",
    "UnexpectedReply",
]
