"""MachineHost / AsyncMachineHost: run to completion, timers, rejections, dispatch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swactor.fsm.generated import edge_teardown as et
from swactor.fsm.host import AsyncMachineHost, MachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.wire import EdgeId, RingId, UninstallReason


class Numbers:
    """A stand-in machine: event n answers effects (n, 0), (n, 1); event 0 is refused."""

    def __init__(self) -> None:
        self.handled: list[int] = []

    def handle(self, event: int) -> list[Any]:
        if event == 0:
            raise ProtocolError("numbers", "S", "int", "zero")
        self.handled.append(event)
        return [Pair(event, 0), Pair(event, 1)]


class Pair(tuple[int, int]):
    def __new__(cls, event: int, index: int) -> Pair:
        return super().__new__(cls, (event, index))


class Binding:
    """Feeds n + 10 from the first effect of events below 10; fails on event 99's first
    effect and on event 7's second."""

    def __init__(self) -> None:
        self.machine = Numbers()
        self.carried: list[tuple[int, int]] = []
        self.host: MachineHost[int] = MachineHost(self.machine, {Pair: self.carry})

    def carry(self, effect: Pair) -> None:
        self.carried.append(tuple(effect))  # type: ignore[arg-type]
        event, index = effect
        if event == 99 or (event, index) == (7, 1):
            raise RuntimeError("effect failed")
        if event < 10 and index == 0:
            self.host.feed(event + 10)


def test_an_event_fed_from_an_effect_waits_for_the_current_events_effects() -> None:
    b = Binding()
    b.host.feed(1)
    assert b.machine.handled == [1, 11]
    assert b.carried == [(1, 0), (1, 1), (11, 0), (11, 1)]


def test_a_failing_effect_propagates_and_queued_events_are_handled_next() -> None:
    b = Binding()
    with pytest.raises(RuntimeError):
        b.host.feed(7)  # (7, 0) queues 17, then (7, 1) raises
    assert b.machine.handled == [7]
    b.host.feed(2)  # 17 is still queued: handled first
    assert b.machine.handled == [7, 17, 2, 12]


def test_a_refused_event_raises_without_a_hook_and_reaches_the_hook_with_one() -> None:
    b = Binding()
    with pytest.raises(ProtocolError):
        b.host.feed(0)
    refused: list[tuple[int, str]] = []

    def rejected(event: int, error: ProtocolError) -> None:
        refused.append((event, error.reason))
        host.feed(5)  # a fallback event, queued behind

    host = MachineHost(b.machine, {Pair: b.carried.append}, rejected=rejected)
    host.feed(0)
    assert refused == [(0, "zero")]
    assert b.machine.handled == [5]


class Timers:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def start(self, name: str, seconds: float, message: Any) -> None:
        self.calls.append(("start", name, seconds, type(message).__name__))

    def cancel(self, name: str) -> bool:
        self.calls.append(("cancel", name))
        return True


class Teardown(et.EdgeTeardownEffects[None]):
    """A real table's binding: records its effect calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def stop_pump(self, edge_id: EdgeId) -> None:
        self.calls.append(("stop_pump", edge_id))

    def uninstall_ring(self, ring_id: RingId, reason: UninstallReason) -> None:
        self.calls.append(("uninstall_ring", ring_id, reason))

    def release_ring(self, ring_id: RingId, worker_reaped: bool) -> None:
        self.calls.append(("release_ring", ring_id, worker_reaped))

    def edge_torn_down(self, edge_id: EdgeId, clean: bool) -> None:
        self.calls.append(("edge_torn_down", edge_id, clean))


class _NoGuards:
    pass


def _teardown_machine() -> et.EdgeTeardownMachine:
    return et.EdgeTeardownMachine(_NoGuards(), edge_id=EdgeId(3), ring_id=RingId(4),
                                  reason=UninstallReason.EdgeStopped, step_timeout_s=2.0)


def test_a_generated_machine_runs_its_timers_and_calls_its_effect_methods() -> None:
    port, timers = Teardown(), Timers()
    host = MachineHost(_teardown_machine(), et.bind(port), timers=timers,
                       timer_events=et.TIMER_EVENTS)
    host.feed(et.StopEdge(EdgeId(3)))
    host.feed(et.PumpStopped(EdgeId(3)))
    host.feed(et.WorkerReaped(RingId(4)))
    host.feed(et.TeardownStepTimeout())
    assert port.calls == [
        ("stop_pump", EdgeId(3)),
        ("uninstall_ring", RingId(4), UninstallReason.EdgeStopped),
        ("release_ring", RingId(4), True),
        ("edge_torn_down", EdgeId(3), False),
    ]
    assert timers.calls == [
        ("start", "TeardownStepTimeout", 2.0, "TeardownStepTimeout"),
        ("cancel", "TeardownStepTimeout"),
        ("start", "TeardownStepTimeout", 2.0, "TeardownStepTimeout"),
        ("cancel", "TeardownStepTimeout"),
        ("start", "TeardownStepTimeout", 2.0, "TeardownStepTimeout"),
        ("cancel", "TeardownStepTimeout"),
    ]


def test_a_timer_effect_without_timers_is_an_error() -> None:
    host = MachineHost(_teardown_machine(), et.bind(Teardown()))
    with pytest.raises(RuntimeError, match="no timers"):
        host.feed(et.StopEdge(EdgeId(3)))


def test_the_async_host_awaits_each_effect_in_order() -> None:
    order: list[str] = []

    async def step(name: str) -> None:
        order.append(f"{name} begins")
        await asyncio.sleep(0)
        order.append(f"{name} ends")

    async def run() -> None:
        host: AsyncMachineHost[int] = AsyncMachineHost(
            Numbers(), {Pair: lambda e: step(f"{e[0]}.{e[1]}")})
        await host.feed(1)

    asyncio.run(run())
    assert order == ["1.0 begins", "1.0 ends", "1.1 begins", "1.1 ends"]
