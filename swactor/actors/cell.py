"""`ActorCell`: the run loop and lifecycle of one actor.

Theory of operation. Each actor is one asyncio task running `ActorCell._run`:

1. Start an incarnation: build the actor from its factory, call `started(ctx)`.
2. Loop: take the next mailbox item, dispatch it, repeat until a stop is requested.
   Items are user envelopes (message, sender, optional ask reply future) and runtime
   markers: `TimerFired` (resolved against the timers, so a cancelled timer delivers
   nothing), `_TaskFailed` (an owned task raised), `_ChildFailed` (a child escalated).
   A stop request sets a flag and drops a wake-up marker in the mailbox, so the loop
   ends after the current item, ahead of any backlog.
3. Any `Exception` from `started()`, a handler, or a marker is a failure: the ask being
   served (if any) fails with `ActorCrashed`, and the strategy decides (see
   `supervision`). Restart tears the incarnation down and builds a new one; stop and
   escalate end the actor as crashed.
4. Terminate: close the mailbox (queued asks fail with `ActorNotAlive`, the rest are
   counted as dead letters), cancel timers and owned tasks, stop and await the children,
   call `stopped(ctx)`, leave the parent, then post `Terminated` to every watcher and
   resolve `terminated`.

Exceptions never leave the task; a hook that raises while stopping is logged and ignored.
If the task itself is cancelled (forced runtime shutdown), step 4 runs without awaiting:
children are cancelled too and the synchronous `cancelled(ctx)` hook replaces `stopped`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Never, TypeVar

from swactor.actors.actor import Actor
from swactor.actors.address import Address
from swactor.actors.context import Context, Reply
from swactor.actors.errors import (
    ActorCrashed,
    ActorNotAlive,
    ChildFailed,
    InvalidActorName,
    NoReply,
    RestartBudgetExhausted,
)
from swactor.actors.mailbox import Mailbox, MailboxClosed
from swactor.actors.messages import StopReason, Terminated
from swactor.actors.ref import ActorRef
from swactor.actors.supervision import Directive, RestartBudget, SupervisorStrategy
from swactor.actors.timers import TimerFired, Timers

if TYPE_CHECKING:
    from swactor.actors.runtime import Runtime

M = TypeVar("M")
N = TypeVar("N")
T = TypeVar("T")

log = logging.getLogger("swactor.actors")


@dataclass(slots=True)
class _Envelope:
    message: object
    sender: Address | None
    reply: asyncio.Future[Any] | None


@dataclass(frozen=True, slots=True)
class _TaskFailed:
    incarnation: int
    error: Exception


@dataclass(frozen=True, slots=True)
class _ChildFailed:
    child: Address
    error: Exception


class _Wake:
    """Marker that only wakes the loop so it sees the stop flag."""


_Item = _Envelope | TimerFired | _TaskFailed | _ChildFailed | _Wake


class ActorCell(Generic[M]):
    """Runtime state of one actor; see the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        parent: ActorCell[Any] | None,
        address: Address,
        factory: Callable[[], Actor[M]],
        strategy: SupervisorStrategy,
        mailbox_capacity: int | None,
    ) -> None:
        self.runtime = runtime
        self.parent = parent
        self.address = address
        self.ref: ActorRef[M] = ActorRef(self)
        self.children: dict[str, ActorCell[Any]] = {}
        self.accepting = True
        self._factory = factory
        self._strategy = strategy
        self._budget = RestartBudget(strategy.max_restarts, strategy.within_s)
        self._mailbox: Mailbox[_Item] = Mailbox(mailbox_capacity)
        self._context: Context[M] = Context(self)
        self.timers: Timers[M] = Timers(self._post_item)
        self._actor: Actor[M] | None = None
        self._incarnation = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchers: set[ActorCell[Any]] = set()
        self._watching: set[ActorCell[Any]] = set()
        self._stop_requested = False
        self._current: _Envelope | None = None
        self._reply_deferred = False
        loop = asyncio.get_running_loop()
        self.terminated: asyncio.Future[Terminated] = loop.create_future()
        self._task = loop.create_task(self._run(), name=f"actor {address}")

    # ----------------------------------------------------------------- mail in

    def post_message(
        self, message: object, sender: Address | None, reply: asyncio.Future[Any] | None = None
    ) -> bool:
        if not self.accepting:
            self.runtime.count_dead_letter(self.address, message)
            return False
        self._mailbox.put_nowait(_Envelope(message, sender, reply))
        return True

    async def put_message(self, message: object, sender: Address | None) -> None:
        if not self.accepting:
            raise MailboxClosed
        await self._mailbox.put(_Envelope(message, sender, None))

    def _post_item(self, item: _Item) -> None:
        if self.accepting:
            self._mailbox.put_nowait(item)

    def post_terminated(self, record: Terminated) -> None:
        self.post_message(record, record.address)

    def post_child_failed(self, child: Address, error: Exception) -> None:
        self._post_item(_ChildFailed(child, error))

    def request_stop(self) -> None:
        if self._stop_requested or not self.accepting:
            return
        self._stop_requested = True
        self._mailbox.put_nowait(_Wake())

    # ---------------------------------------------------------- context support

    @property
    def current_sender(self) -> Address | None:
        return None if self._current is None else self._current.sender

    @property
    def current_reply(self) -> Reply:
        return Reply(None if self._current is None else self._current.reply)

    def defer_reply(self) -> Reply:
        self._reply_deferred = True
        return self.current_reply

    def spawn_child(
        self,
        factory: Callable[[], Actor[N]],
        name: str | None,
        strategy: SupervisorStrategy | None,
        mailbox_capacity: int | None,
    ) -> ActorRef[N]:
        if not self.accepting:
            raise ActorNotAlive(self.address, "spawn a child")
        name = self.runtime.child_name(factory, name, self.children)
        child = ActorCell(
            self.runtime,
            self,
            Address(f"{self.address.path}/{name}", self.runtime.next_uid()),
            factory,
            strategy or SupervisorStrategy.stop(),
            mailbox_capacity,
        )
        self.children[name] = child
        return child.ref

    def watch(self, target: ActorRef[Never]) -> None:
        cell = target._cell
        if cell is self:
            raise InvalidActorName(f"{self.address}: an actor cannot watch itself")
        if cell.terminated.done():
            self.post_terminated(cell.terminated.result())
            return
        cell._watchers.add(self)
        self._watching.add(cell)

    def unwatch(self, target: ActorRef[Never]) -> None:
        cell = target._cell
        cell._watchers.discard(self)
        self._watching.discard(cell)

    def spawn_task(self, coro: Coroutine[Any, Any, T], name: str | None) -> asyncio.Task[T]:
        incarnation = self._incarnation
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._tasks.discard(finished)
            if finished.cancelled():
                return
            error = finished.exception()
            if isinstance(error, Exception):
                self._post_item(_TaskFailed(incarnation, error))

        task.add_done_callback(done)
        return task

    # ---------------------------------------------------------------- the loop

    async def _run(self) -> None:
        reason, error = StopReason.Stopped, None
        forced = False
        try:
            failure = await self._attempt(self._start_incarnation())
            while True:
                if failure is not None:
                    verdict, failure = await self._supervise(failure)
                    if verdict is not None:
                        reason, error = StopReason.Crashed, verdict
                        break
                    continue
                if self._stop_requested:
                    break
                try:
                    item = await self._mailbox.get()
                except MailboxClosed:
                    break
                if self._stop_requested:
                    self._discard(item)
                    break
                try:  # inlined _attempt(): this is the per-message hot path
                    if type(item) is _Envelope:
                        await self._deliver(item)
                    else:
                        await self._dispatch(item)
                except Exception as raised:  # supervision catches everything
                    failure = self._failed(raised)
        except asyncio.CancelledError:
            forced = True
            raise
        finally:
            await self._terminate(reason, error, forced)

    async def _attempt(self, step: Coroutine[Any, Any, None]) -> Exception | None:
        try:
            await step
        except Exception as error:  # supervision catches everything
            return self._failed(error)
        return None

    def _failed(self, failure: Exception) -> Exception:
        """Fail the ask being served, if any; return the failure for supervision."""
        current, self._current = self._current, None
        if current is not None and current.reply is not None and not current.reply.done():
            crashed = ActorCrashed(self.address, failure)
            crashed.__cause__ = failure
            current.reply.set_exception(crashed)
        return failure

    async def _start_incarnation(self) -> None:
        self._incarnation += 1
        self._actor = self._factory()
        await self._actor.started(self._context)

    async def _dispatch(self, item: _Item) -> None:
        if isinstance(item, _Envelope):
            await self._deliver(item)
        elif isinstance(item, TimerFired):
            current, message = self.timers.claim(item)
            if current:
                await self._deliver(_Envelope(message, None, None))
        elif isinstance(item, _TaskFailed):
            if item.incarnation == self._incarnation:
                raise item.error
        elif isinstance(item, _ChildFailed):
            raise ChildFailed(item.child, item.error) from item.error

    async def _deliver(self, envelope: _Envelope) -> None:
        assert self._actor is not None
        self._current, self._reply_deferred = envelope, False
        await self._actor.receive(self._context, envelope.message)  # type: ignore[arg-type]
        reply = envelope.reply
        if reply is not None and not reply.done() and not self._reply_deferred:
            reply.set_exception(NoReply(self.address, type(envelope.message).__name__))
        self._current = None

    async def _supervise(self, failure: Exception) -> tuple[Exception | None, Exception | None]:
        """(terminal error, None) to end the actor; (None, new failure or None) on restart."""
        try:
            directive = self._strategy.decide(failure)
        except Exception:  # a broken decider must not kill the runtime
            log.exception("%s: supervisor decider raised; stopping", self.address)
            directive = Directive.Stop
        log.warning("%s: failed (%s: %s); %s", self.address, type(failure).__name__,
                    failure, directive.value)
        if directive is Directive.Restart:
            if self._budget.allow(asyncio.get_running_loop().time()):
                await self._end_incarnation()
                return None, await self._attempt(self._start_incarnation())
            exhausted = RestartBudgetExhausted(
                self.address, self._strategy.max_restarts, self._strategy.within_s
            )
            exhausted.__cause__ = failure
            return exhausted, None
        if directive is Directive.Escalate:
            if self.parent is None:
                self.runtime.escalated(self.address, failure)
            else:
                self.parent.post_child_failed(self.address, failure)
        return failure, None

    async def _end_incarnation(self) -> None:
        self.timers.cancel_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        children = list(self.children.values())
        for child in children:
            child.request_stop()
        for child in children:
            await asyncio.shield(child.terminated)
        actor = self._actor
        if actor is not None:
            try:
                await actor.stopped(self._context)
            except Exception:  # a failing stop hook is reported, not fatal
                log.exception("%s: stopped() raised", self.address)
        self._actor = None  # only now: a cancel during stopped() still calls cancelled()

    def _discard(self, item: _Item) -> None:
        if isinstance(item, _Envelope):
            if item.reply is not None and not item.reply.done():
                what = f"ask {type(item.message).__name__}"
                item.reply.set_exception(ActorNotAlive(self.address, what))
            elif not isinstance(item.message, Terminated):
                self.runtime.count_dead_letter(self.address, item.message)

    async def _terminate(self, reason: StopReason, error: Exception | None, forced: bool) -> None:
        self.accepting = False
        for item in self._mailbox.close():
            self._discard(item)
        try:
            if forced:
                self._abandon()
            else:
                try:
                    await self._end_incarnation()
                except asyncio.CancelledError:
                    self._abandon()
                    raise
        finally:
            self._finish(reason, error)

    def _abandon(self) -> None:
        """Forced end: cancel everything without awaiting; `cancelled()` replaces `stopped()`."""
        self.timers.cancel_all()
        for task in list(self._tasks):
            task.cancel()
        for child in list(self.children.values()):
            child._task.cancel()
        actor, self._actor = self._actor, None
        if actor is not None:
            try:
                actor.cancelled(self._context)
            except Exception:  # a failing hook is reported, not fatal
                log.exception("%s: cancelled() raised", self.address)

    def _finish(self, reason: StopReason, error: Exception | None) -> None:
        for watched in self._watching:
            watched._watchers.discard(self)
        self._watching.clear()
        if self.parent is not None:
            self.parent.children.pop(self.address.name, None)
        else:
            self.runtime.forget(self.address)
        record = Terminated(self.address, reason, error)
        for watcher in list(self._watchers):
            watcher.post_terminated(record)
        self._watchers.clear()
        if not self.terminated.done():
            self.terminated.set_result(record)
