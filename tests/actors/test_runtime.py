"""Actor semantics: ordering, watch, timers, ask, supervision, runtime survival."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from swactor.actors import (
    Actor,
    ActorCrashed,
    ActorNotAlive,
    ActorRef,
    AskTimeout,
    ChildFailed,
    Context,
    InvalidActorName,
    NoReply,
    RestartBudgetExhausted,
    Runtime,
    StopReason,
    SupervisorStrategy,
    Terminated,
    UnexpectedReply,
)
from swactor.fsm.runtime import CancelTimer, StartTimer


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=10))


@dataclass(frozen=True)
class Num:
    sender: str
    n: int


class Recorder(Actor[Any]):
    """Records every message; replies to asks with ("ok", message)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.arrived = asyncio.Event()

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        self.seen.append(message)
        self.arrived.set()
        ctx.reply(("ok", message))


async def until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


# ---------------------------------------------------------------- ordering


class Sender(Actor[str]):
    def __init__(self, target: ActorRef[Num], name: str, count: int) -> None:
        self.target, self.name, self.count = target, name, count

    async def receive(self, ctx: Context[str], message: str) -> None:
        for n in range(self.count):
            ctx.tell(self.target, Num(self.name, n))
            if n % 7 == 0:
                await asyncio.sleep(0)  # let the other senders interleave


def test_messages_from_each_sender_arrive_in_send_order() -> None:
    async def body() -> None:
        recorder = Recorder()
        async with Runtime() as rt:
            target: ActorRef[Num] = rt.spawn(lambda: recorder, "target")
            names = ["a", "b", "c"]
            senders = [rt.spawn(partial(Sender, target, n, 300), n) for n in names]
            for sender in senders:
                sender.tell("go")
            await until(lambda: len(recorder.seen) == 900)
            for name in names:
                got = [m.n for m in recorder.seen if m.sender == name]
                assert got == list(range(300))
            # the senders really interleaved, so the order check above means something
            first_senders = {m.sender for m in recorder.seen[:50]}
            assert len(first_senders) > 1

    run(body)


# ------------------------------------------------------------------- watch


class Crasher(Actor[str]):
    async def receive(self, ctx: Context[str], message: str) -> None:
        if message == "crash":
            raise ValueError("boom on purpose")
        if message == "stop":
            ctx.stop_self()
        ctx.reply(message)


class Watcher(Actor[Any]):
    def __init__(self, target: ActorRef[Any]) -> None:
        self.target = target
        self.terminated: list[Terminated] = []

    async def started(self, ctx: Context[Any]) -> None:
        ctx.watch(self.target)

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if isinstance(message, Terminated):
            self.terminated.append(message)


def test_watcher_receives_terminated_with_the_crash_error() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            crasher = rt.spawn(Crasher, "crasher")
            watcher = Watcher(crasher)
            rt.spawn(lambda: watcher, "watcher")
            await asyncio.sleep(0.01)
            crasher.tell("crash")
            await until(lambda: bool(watcher.terminated))
            (record,) = watcher.terminated
            assert record.address == crasher.address
            assert record.reason is StopReason.Crashed
            assert isinstance(record.error, ValueError)
            assert not crasher.alive
            assert (await crasher.join()).reason is StopReason.Crashed

    run(body)


def test_watcher_receives_terminated_on_stop_and_on_late_watch() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            stopper = rt.spawn(Crasher, "stopper")
            watcher = Watcher(stopper)
            rt.spawn(lambda: watcher, "watcher")
            await asyncio.sleep(0.01)
            stopper.tell("stop")
            await until(lambda: bool(watcher.terminated))
            assert watcher.terminated[0].reason is StopReason.Stopped
            assert watcher.terminated[0].error is None
            # watching an actor that already ended delivers Terminated at once
            late = Watcher(stopper)
            rt.spawn(lambda: late, "late")
            await until(lambda: bool(late.terminated))
            assert late.terminated[0].address == stopper.address

    run(body)


# ------------------------------------------------------------------ timers


@dataclass(frozen=True)
class Tick:
    label: str


class TimerUser(Actor[Any]):
    def __init__(self) -> None:
        self.ticks: list[str] = []

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        match message:
            case ("start", name, seconds):
                ctx.timers.start(name, seconds, Tick(name))
            case ("repeat", name, seconds):
                ctx.timers.start(name, seconds, Tick(name), repeat=True)
            case ("cancel", name):
                ctx.reply(ctx.timers.cancel(name))
            case ("busy", seconds):
                await asyncio.sleep(seconds)
            case Tick(label=label):
                self.ticks.append(label)


def test_timer_delivers_its_message_and_cancel_prevents_it() -> None:
    async def body() -> None:
        user = TimerUser()
        async with Runtime() as rt:
            ref = rt.spawn(lambda: user, "timers")
            ref.tell(("start", "fires", 0.02))
            ref.tell(("start", "cancelled", 0.05))
            assert await ref.ask(("cancel", "cancelled"), timeout=1) is True
            await until(lambda: user.ticks == ["fires"])
            await asyncio.sleep(0.1)
            assert user.ticks == ["fires"]
            assert await ref.ask(("cancel", "fires"), timeout=1) is False  # one-shot, gone

    run(body)


def test_timer_cancelled_after_firing_but_before_handling_delivers_nothing() -> None:
    async def body() -> None:
        user = TimerUser()
        async with Runtime() as rt:
            ref = rt.spawn(lambda: user, "timers")
            ref.tell(("start", "stale", 0.01))
            ref.tell(("busy", 0.1))  # the timer fires while this handler sleeps
            ref.tell(("cancel", "stale"))  # queued ahead of the fired marker
            ref.tell(("start", "after", 0.01))
            await until(lambda: user.ticks == ["after"])
            await asyncio.sleep(0.05)
            assert user.ticks == ["after"]

    run(body)


def test_repeating_timer_ticks_until_cancelled() -> None:
    async def body() -> None:
        user = TimerUser()
        async with Runtime() as rt:
            ref = rt.spawn(lambda: user, "timers")
            ref.tell(("repeat", "tick", 0.01))
            await until(lambda: len(user.ticks) >= 3)
            await ref.ask(("cancel", "tick"), timeout=1)
            count = len(user.ticks)
            await asyncio.sleep(0.05)
            assert len(user.ticks) == count

    run(body)


# --------------------------------------------------------------------- ask


class Asked(Actor[str]):
    def __init__(self) -> None:
        self.kept: list[Any] = []

    async def receive(self, ctx: Context[str], message: str) -> None:
        if message == "later":
            self.kept.append(ctx.reply_later())  # never answered
        elif message == "forget":
            pass
        elif message == "crash":
            raise RuntimeError("asked to crash")
        else:
            ctx.reply(message.upper())


def test_ask_replies_and_each_failure_mode_is_typed() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            ref = rt.spawn(Asked, "asked")
            assert await ref.ask("hi", timeout=1, expect=str) == "HI"
            with pytest.raises(UnexpectedReply):
                await ref.ask("hi", timeout=1, expect=int)
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(AskTimeout) as timed_out:
                await ref.ask("later", timeout=0.05)
            assert 0.04 <= loop.time() - began < 1.0
            assert timed_out.value.address == ref.address
            assert isinstance(timed_out.value, TimeoutError)
            with pytest.raises(NoReply):
                await ref.ask("forget", timeout=1)
            with pytest.raises(ActorCrashed) as crashed:
                await ref.ask("crash", timeout=1)
            assert isinstance(crashed.value.error, RuntimeError)
            await ref.join()
            with pytest.raises(ActorNotAlive):
                await ref.ask("hi", timeout=1)

    run(body)


def test_asks_queued_behind_a_stop_fail_not_alive() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            ref = rt.spawn(TimerUser, "slow")
            ref.tell(("busy", 0.05))
            pending = asyncio.ensure_future(ref.ask(("cancel", "x"), timeout=2))
            await asyncio.sleep(0.01)
            ref.stop()
            with pytest.raises(ActorNotAlive):
                await pending

    run(body)


# ------------------------------------------------------------- supervision


class Counter(Actor[str]):
    starts = 0

    def __init__(self) -> None:
        self.count = 0

    async def started(self, ctx: Context[str]) -> None:
        Counter.starts += 1

    async def receive(self, ctx: Context[str], message: str) -> None:
        if message == "crash":
            raise KeyError("crash on purpose")
        self.count += 1
        ctx.reply(self.count)


def test_restart_builds_fresh_state_and_keeps_the_mailbox() -> None:
    async def body() -> None:
        Counter.starts = 0
        async with Runtime() as rt:
            ref = rt.spawn(Counter, "counter", strategy=SupervisorStrategy.restart(3, 10.0))
            assert await ref.ask("inc", timeout=1) == 1
            assert await ref.ask("inc", timeout=1) == 2
            ref.tell("crash")
            # queued behind the crash: survives the restart and sees fresh state
            assert await ref.ask("inc", timeout=1) == 1
            assert Counter.starts == 2
            assert ref.alive

    run(body)


def test_restart_budget_exhausted_stops_the_actor_as_crashed() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            ref = rt.spawn(Counter, "counter", strategy=SupervisorStrategy.restart(2, 10.0))
            for _ in range(3):
                ref.tell("crash")
            record = await ref.join()
            assert record.reason is StopReason.Crashed
            assert isinstance(record.error, RestartBudgetExhausted)
            assert isinstance(record.error.__cause__, KeyError)

    run(body)


class Parent(Actor[Any]):
    def __init__(self, child_strategy: SupervisorStrategy) -> None:
        self.child_strategy = child_strategy
        self.child: ActorRef[str] | None = None

    async def started(self, ctx: Context[Any]) -> None:
        self.child = ctx.spawn(Counter, "child", strategy=self.child_strategy)

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        ctx.reply(self.child)


def test_escalation_fails_the_parent_whose_strategy_then_applies() -> None:
    async def body() -> None:
        Counter.starts = 0
        async with Runtime() as rt:
            parent = rt.spawn(lambda: Parent(SupervisorStrategy.escalate()), "parent")
            child: ActorRef[str] = await parent.ask("child?", timeout=1)
            watcher = Watcher(parent)
            rt.spawn(lambda: watcher, "watcher")
            await asyncio.sleep(0.01)
            child.tell("crash")
            await until(lambda: bool(watcher.terminated))
            record = watcher.terminated[0]
            assert record.reason is StopReason.Crashed
            assert isinstance(record.error, ChildFailed)
            assert record.error.child == child.address
            assert not child.alive

    run(body)


def test_escalation_past_the_root_is_recorded_and_the_runtime_lives_on() -> None:
    async def body() -> None:
        seen: list[str] = []
        async with Runtime(on_escalation=lambda addr, err: seen.append(addr.name)) as rt:
            ref = rt.spawn(Crasher, "top", strategy=SupervisorStrategy.escalate())
            ref.tell("crash")
            await ref.join()
            assert seen == ["top"]
            assert [(a.name, type(e)) for a, e in rt.escalations] == [("top", ValueError)]
            other = rt.spawn(Crasher, "next")
            assert await other.ask("still here", timeout=1) == "still here"

    run(body)


def test_runtime_survives_an_actor_exception() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            bystander = rt.spawn(Counter, "bystander")
            crasher = rt.spawn(Crasher, "crasher")
            crasher.tell("crash")
            assert (await crasher.join()).reason is StopReason.Crashed
            assert await bystander.ask("inc", timeout=1) == 1
            # the crashed name is free again and a new actor may take it
            again = rt.spawn(Crasher, "crasher")
            assert await again.ask("x", timeout=1) == "x"
            assert crasher.tell("late") is False
            assert rt.dead_letters >= 1

    run(body)


class FailingTask(Actor[str]):
    async def started(self, ctx: Context[str]) -> None:
        async def explode() -> None:
            await asyncio.sleep(0.01)
            raise OSError("owned task failed")

        ctx.spawn_task(explode())


def test_an_owned_task_that_raises_fails_its_actor() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            ref = rt.spawn(FailingTask, "tasks")
            record = await ref.join()
            assert isinstance(record.error, OSError)

    run(body)


# --------------------------------------------------------- stop & lifecycle


class Tree(Actor[str]):
    def __init__(self, log: list[str], depth: int) -> None:
        self.log, self.depth = log, depth

    async def started(self, ctx: Context[str]) -> None:
        if self.depth:
            ctx.spawn(lambda: Tree(self.log, self.depth - 1), f"level{self.depth - 1}")

    async def stopped(self, ctx: Context[str]) -> None:
        self.log.append(ctx.address.name)


def test_stop_stops_children_first_and_shutdown_stops_everything() -> None:
    async def body() -> None:
        log: list[str] = []
        rt = Runtime()
        root = rt.spawn(lambda: Tree(log, 2), "level2")
        await asyncio.sleep(0.01)
        assert [c.address.name for c in rt.actors] == ["level2"]
        await root.stop_and_join()
        assert log == ["level0", "level1", "level2"]
        rt.spawn(lambda: Tree(log, 1), "again")
        await asyncio.sleep(0.01)
        await rt.shutdown()
        assert log[3:] == ["level0", "again"]
        assert rt.actors == []

    run(body)


def test_send_waits_while_the_mailbox_is_at_capacity() -> None:
    async def body() -> None:
        gate = asyncio.Event()

        class Blocked(Actor[int]):
            async def receive(self, ctx: Context[int], message: int) -> None:
                await gate.wait()

        async with Runtime() as rt:
            ref = rt.spawn(Blocked, "blocked", mailbox_capacity=4)
            sent = 0

            async def produce() -> None:
                nonlocal sent
                for n in range(20):
                    await ref.send(n)
                    sent += 1

            producer = asyncio.ensure_future(produce())
            await asyncio.sleep(0.05)
            assert sent == 5  # one in the handler, four queued
            gate.set()
            await asyncio.wait_for(producer, 2)
            assert sent == 20

    run(body)


def test_bad_names_are_rejected() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            rt.spawn(Counter, "same")
            with pytest.raises(InvalidActorName):
                rt.spawn(Counter, "same")
            with pytest.raises(InvalidActorName):
                rt.spawn(Counter, "a/b")

    run(body)


# ------------------------------------------- a machine binding and its timers


@dataclass(frozen=True)
class Arm:
    seconds: float


@dataclass(frozen=True)
class Disarm:
    pass


@dataclass(frozen=True)
class Expired:
    pass


class TinyMachine:
    """Stand-in for a generated machine: Arm -> StartTimer, Disarm -> CancelTimer."""

    def __init__(self) -> None:
        self.expired = 0

    def handle(self, event: object) -> list[object]:
        match event:
            case Arm(seconds=seconds):
                return [StartTimer("Expired", seconds)]
            case Disarm():
                return [CancelTimer("Expired")]
            case Expired():
                self.expired += 1
                return ["report-expired"]
        raise AssertionError(event)


class Binding(Actor[Any]):
    def __init__(self, machine: TinyMachine) -> None:
        self.machine = machine
        self.other_effects: list[object] = []

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        for effect in self.machine.handle(message):
            if not ctx.timers.apply(effect, {"Expired": Expired}):
                self.other_effects.append(effect)


def test_a_binding_applies_generated_timer_effects() -> None:
    async def body() -> None:
        machine = TinyMachine()
        binding = Binding(machine)
        async with Runtime() as rt:
            ref = rt.spawn(lambda: binding, "binding")
            ref.tell(Arm(0.02))
            await until(lambda: machine.expired == 1)
            assert binding.other_effects == ["report-expired"]
            ref.tell(Arm(0.05))
            ref.tell(Disarm())
            await asyncio.sleep(0.1)
            assert machine.expired == 1  # the disarmed timer never fed Expired back

    run(body)


# ------------------------------------------------------- hooks that misbehave


class BadStart(Actor[str]):
    starts = 0

    async def started(self, ctx: Context[str]) -> None:
        BadStart.starts += 1
        raise RuntimeError("cannot start")


class BadStop(Actor[str]):
    async def receive(self, ctx: Context[str], message: str) -> None:
        ctx.reply(message)

    async def stopped(self, ctx: Context[str]) -> None:
        raise RuntimeError("cannot stop cleanly")


def test_a_failing_started_hook_is_supervised_like_a_failing_handler() -> None:
    async def body() -> None:
        BadStart.starts = 0
        async with Runtime() as rt:
            ref = rt.spawn(BadStart, "bad", strategy=SupervisorStrategy.restart(2, 10.0))
            record = await ref.join()
            assert BadStart.starts == 3  # first start and two restarts
            assert isinstance(record.error, RestartBudgetExhausted)

    run(body)


def test_a_failing_stopped_hook_still_terminates_and_notifies() -> None:
    async def body() -> None:
        async with Runtime() as rt:
            ref = rt.spawn(BadStop, "bad")
            watcher = Watcher(ref)
            rt.spawn(lambda: watcher, "watcher")
            assert await ref.ask("ok", timeout=1) == "ok"
            await ref.stop_and_join()
            await until(lambda: bool(watcher.terminated))
            assert watcher.terminated[0].reason is StopReason.Stopped

    run(body)


class Stuck(Actor[str]):
    async def receive(self, ctx: Context[str], message: str) -> None:
        await asyncio.Event().wait()  # never returns


def test_shutdown_cancels_an_actor_stuck_in_its_handler() -> None:
    async def body() -> None:
        rt = Runtime()
        ref = rt.spawn(Stuck, "stuck")
        ref.tell("hang")
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await rt.shutdown(timeout_s=0.2)
        assert loop.time() - began < 2.0
        assert not ref.alive
        assert (await ref.join()).reason is StopReason.Stopped
        assert rt.actors == []

    run(body)
